"""The rehearsal's tiny model and data (sao_repro.areal.tiny): the cache is checked against its manifest, rebuilt when
damaged, kept when intact."""

import os

import pytest


@pytest.mark.slow
def test_a_damaged_rehearsal_cache_is_named_and_rebuilt_and_a_good_one_kept(tmp_path, capsys):
    from sao_repro.areal.tiny import CACHE_MANIFEST, cache_damage, tiny_assets

    d = tiny_assets(root=tmp_path)
    assert cache_damage(d) is None
    weights = d / "model" / "model.safetensors"
    good, mtime = weights.read_bytes(), weights.stat().st_mtime_ns
    assert tiny_assets(root=tmp_path) == d and weights.stat().st_mtime_ns == mtime  # a good cache is used as it is
    os.truncate(weights, len(good) // 2)  # a torn download / a full disk
    assert "model/model.safetensors has" in cache_damage(d)
    assert tiny_assets(root=tmp_path) == d
    assert "model/model.safetensors has" in capsys.readouterr().err  # it says what it rebuilt and why
    assert weights.read_bytes() == good and cache_damage(d) is None  # the same build again (seeded), intact
    (d / CACHE_MANIFEST).unlink()  # an unfinished build, or one from before the manifest
    (d / "data" / "train.jsonl").write_text("")
    assert "no cache_manifest.json" in cache_damage(d)
    assert (
        tiny_assets(root=tmp_path) == d and cache_damage(d) is None and (d / "data" / "train.jsonl").stat().st_size > 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]  # no temporary or damaged folder left beside it
