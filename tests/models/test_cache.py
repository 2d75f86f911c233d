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
