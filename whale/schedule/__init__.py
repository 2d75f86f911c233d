"""WHALE's schedules: alternate weight phases and harness phases (`loop`), the `whale cotrain`
run over every schedule on one ledger (`cotrain`), the checks before it starts (`setup`), and
the curves of eval accuracy against training rollouts (`curves`)."""
