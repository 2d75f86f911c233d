"""Choices are `Literal` fields (issue 22): a value outside them is refused, from a TOML file,
from `--set` and in a config built in Python, naming the field and every choice in one wording;
each field's Literal is the one list of its choices (the constants other code iterates are made
from it, and the comments that name the choices agree with it)."""

from __future__ import annotations

import inspect
import re
import typing

import pytest
from typer.testing import CliRunner

from whale import config as cfgmod
from whale.analysis.diagnose import DiagnoseConfig
from whale.analysis.tracking import TRACKER_KINDS
from whale.cli import app
from whale.metaharness.agent import EXAMPLES, AgentConfig, Example
from whale.metaharness.run import SearchConfig
from whale.revise.proposer import ProposerConfig
from whale.revise.run import AdaptConfig
from whale.revise.select import SELECT_RULES
from whale.schedule.cotrain import SERVING, CotrainConfig
from whale.schedule.loop import SCHEDULES, ScheduleKind
from whale.train.proposer.contexts import Decoding
from whale.train.proposer.run import ProposerTrainConfig
from whale.train.proposer.sft import ProposerSFTSettings

# Every field that was a string checked by `one_of` and is now a Literal: (config, field).
CONVERTED = [
    (AdaptConfig, "select"), (AdaptConfig, "tracking"), (SearchConfig, "tracking"),
    (CotrainConfig, "tracking"), (CotrainConfig, "serving"), (CotrainConfig, "operator"),
    (ProposerTrainConfig, "tracking"), (DiagnoseConfig, "serving"),
    (DiagnoseConfig, "operator"), (AgentConfig, "grammar"), (AgentConfig, "protocol"),
    (AgentConfig, "example"), (ProposerConfig, "grammar"), (ProposerSFTSettings, "scheduler"),
    (Decoding, "grammar"),
]  # fmt: skip


def choices(cls: type, name: str) -> tuple[str, ...]:
    return typing.get_args(typing.get_type_hints(cls)[name])


def refusal(cls: type, name: str, value: object) -> str:
    return f"{name}: {value!r} is not one of {', '.join(map(repr, choices(cls, name)))}"


@pytest.mark.parametrize("cls, name", CONVERTED, ids=lambda x: getattr(x, "__name__", x))
def test_a_converted_field_is_a_literal_holding_its_default(cls, name):
    offered = choices(cls, name)
    assert typing.get_origin(typing.get_type_hints(cls)[name]) is typing.Literal
    assert getattr(cls(), name) in offered


@pytest.mark.parametrize("cls, name", CONVERTED, ids=lambda x: getattr(x, "__name__", x))
def test_a_bad_choice_built_in_python_is_refused_by_validate(cls, name):
    with pytest.raises(ValueError) as e:
        cls(**{name: "bogus"}).validate()
    assert str(e.value) == refusal(cls, name, "bogus")


def test_a_bad_choice_in_a_toml_file_names_the_field_and_the_choices(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('select = "greedy"\n')
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.load(AdaptConfig, path)
    assert str(e.value) == "select: 'greedy' is not one of 'ratchet', 'best-of-g'"


def test_a_bad_choice_of_a_nested_config_names_the_dotted_field(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[agent]\nprotocol = "smoke"\n')
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.load(CotrainConfig, path)
    assert str(e.value) == "agent.protocol: 'smoke' is not one of 'auto', 'text', 'functions'"


def test_a_bad_choice_given_by_set_is_exit_2_naming_the_field_and_the_choices(tmp_path):
    r = CliRunner().invoke(app, ["cotrain", "--set", "serving=tpu", "--out",
                                 str(tmp_path / "x")], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 2
    assert "serving: 'tpu' is not one of 'embedded', 'hf', 'vllm'" in " ".join(r.output.split())
    assert not (tmp_path / "x").exists()  # refused before anything is made


def test_a_choice_of_another_type_is_refused_in_the_same_words():
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.load(AdaptConfig, overrides=["select=3"])
    assert str(e.value) == "select: 3 is not one of 'ratchet', 'best-of-g'"


def test_a_list_of_choices_refuses_an_unknown_member():
    with pytest.raises(cfgmod.ConfigError, match=r"schedules: expected a list of one of 'adapt"):
        cfgmod.load(CotrainConfig, overrides=["schedules=['adaptive', 'sometimes']"])


def test_a_good_choice_loads_and_saves_back_as_given(tmp_path):
    cfg = cfgmod.load(CotrainConfig, overrides=["serving=hf", "operator=revise",
                                                "agent.example=hinted", "tracking=wandb"])  # fmt: skip
    cfgmod.save(cfg, tmp_path / "config.toml")
    assert cfgmod.load(CotrainConfig, tmp_path / "config.toml") == cfg


def test_the_choice_constants_other_code_iterates_are_the_literals():
    listed = typing.get_type_hints(CotrainConfig)["schedules"]  # list[ScheduleKind]
    assert SCHEDULES == typing.get_args(ScheduleKind) == typing.get_args(typing.get_args(listed)[0])
    assert SERVING == choices(CotrainConfig, "serving") == choices(DiagnoseConfig, "serving")
    assert SELECT_RULES == choices(AdaptConfig, "select")
    assert TRACKER_KINDS == choices(AdaptConfig, "tracking") == choices(SearchConfig, "tracking")
    assert set(EXAMPLES) == set(typing.get_args(Example)) == set(choices(AgentConfig, "example"))


def _comment_of(cls: type, name: str) -> str:
    """The comment lines right above field `name` of `cls` and the one on its line; the class
    docstring where the field has none."""
    lines = inspect.getsource(cls).splitlines()
    at = next(i for i, line in enumerate(lines) if re.match(rf"\s+{name}:", line))
    above = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        above.append(line)
    text = " ".join(above) + lines[at].partition("#")[2]
    return text if text.strip() else (cls.__doc__ or "")


# Fields whose comment (or class docstring) names their choices.
DOCUMENTED = [
    (AdaptConfig, "tracking"), (SearchConfig, "tracking"), (CotrainConfig, "tracking"),
    (ProposerTrainConfig, "tracking"), (CotrainConfig, "serving"), (CotrainConfig, "operator"),
    (AgentConfig, "grammar"), (AgentConfig, "protocol"), (AgentConfig, "example"),
    (ProposerConfig, "grammar"), (Decoding, "grammar"),
]  # fmt: skip


@pytest.mark.parametrize("cls, name", DOCUMENTED, ids=lambda x: getattr(x, "__name__", x))
def test_a_fields_comment_names_every_choice_of_its_literal(cls, name):
    named = set(re.findall(r'"([\w-]+)"', _comment_of(cls, name)))
    assert set(choices(cls, name)) <= named, named
