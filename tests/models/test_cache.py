from tests.fakes import ScriptedModel
from whale.models import CachedModel, ModelConfig, Sampling, build_model

MSG = [{"role": "user", "content": "hi"}]


def test_miss_then_hit(tmp_path):
    inner = ScriptedModel(["first", "second"])
    m = CachedModel(inner, tmp_path / "c.sqlite")
    a = m.chat(MSG, Sampling())
    b = m.chat(MSG, Sampling())
    assert a.text == b.text == "first" and b.cached and not a.cached
    assert len(inner.calls) == 1 and (m.hits, m.misses) == (1, 1)


def test_different_sampling_or_seed_is_a_miss(tmp_path):
    inner = ScriptedModel(["first", "second", "third"])
    m = CachedModel(inner, tmp_path / "c.sqlite")
    m.chat(MSG, Sampling(seed=1))
    assert m.chat(MSG, Sampling(seed=2)).text == "second"
    assert m.chat(MSG, Sampling(seed=1, temperature=0.7)).text == "third"


def test_cache_persists_across_instances(tmp_path):
    CachedModel(ScriptedModel(["kept"]), tmp_path / "c.sqlite").chat(MSG, Sampling())
    inner = ScriptedModel(["fresh"])
    assert CachedModel(inner, tmp_path / "c.sqlite").chat(MSG, Sampling()).text == "kept"
    assert inner.calls == []


def test_cache_can_be_turned_off(tmp_path):
    cfg = ModelConfig(name="stub@http://127.0.0.1:9/v1", cache=False)
    assert not isinstance(build_model(cfg), CachedModel)
    cfg.cache, cfg.cache_path = True, str(tmp_path / "c.sqlite")
    assert isinstance(build_model(cfg), CachedModel)


def test_any_backend_can_be_called_async():
    import asyncio

    from whale.models.base import achat

    inner = ScriptedModel(["async reply"])
    assert asyncio.run(achat(inner, MSG, Sampling())).text == "async reply"


def _cached(tmp_path, replies, prefix_cache=None):
    inner = ScriptedModel(replies)
    if prefix_cache is not None:
        inner.prefix_cache = prefix_cache  # as an embedded server's policy
    return CachedModel(inner, tmp_path / "c.sqlite"), inner


def test_a_greedy_reply_made_reusing_a_prefix_is_not_served_to_a_default_call(tmp_path):
    # Reusing a prefix changes some greedy replies (docs/models.md), so a reply cached under
    # "all" must not answer the same greedy call made under the default "sampled", nor back.
    cached_all, _ = _cached(tmp_path, ["under all"], "all")
    assert cached_all.chat(MSG, Sampling()).text == "under all"
    default, inner = _cached(tmp_path, ["under sampled"], "sampled")
    assert default.chat(MSG, Sampling()).text == "under sampled" and len(inner.calls) == 1
    again, inner = _cached(tmp_path, ["not asked"], "all")
    assert again.chat(MSG, Sampling()).text == "under all" and inner.calls == []


def test_a_sampled_reply_made_without_prefix_reuse_has_its_own_key(tmp_path):
    hot = Sampling(temperature=0.7, seed=3)
    off, _ = _cached(tmp_path, ["under off"], "off")
    assert off.chat(MSG, hot).text == "under off"
    default, inner = _cached(tmp_path, ["under sampled"], "sampled")
    assert default.chat(MSG, hot).text == "under sampled" and len(inner.calls) == 1


def test_a_backend_without_a_policy_keeps_the_default_keys(tmp_path):
    # Remote backends (no prefix_cache attribute) and embedded servers under the default share
    # one key per call, the key caches made before this change used.
    plain, _ = _cached(tmp_path, ["remote"])
    plain.chat(MSG, Sampling())
    default, inner = _cached(tmp_path, ["not asked"], "sampled")
    assert default.chat(MSG, Sampling()).text == "remote" and inner.calls == []


def test_a_seed_outside_the_uint32_range_has_a_key_of_its_own(tmp_path):
    """Such a seed was sent as llama.cpp read it before `wire_seed`; a reply cached then is not
    the reply the same call gets now, so the key says how the seed is sent."""
    from whale.models.base import SEED_SPACE

    assert "wire_seed" not in Sampling(seed=SEED_SPACE - 1).key()
    assert Sampling(seed=SEED_SPACE + 5).key()["wire_seed"] == 5
    assert Sampling(seed=-1).key()["wire_seed"] == SEED_SPACE - 1
