"""Config loading: TOML and JSON, unknown keys and wrong types are errors naming the field."""

from __future__ import annotations

import pytest

from netsense.config import JobConfig, load_config, override, to_dict
from netsense.errors import ConfigError


def test_defaults_and_overrides(tmp_path) -> None:
    p = tmp_path / "job.toml"
    p.write_text('model = "digits-cnn"\nworkers = 3\n[train]\nsteps = 7\nseed = 2\n[transport]\nmax_datagram_size = 1400\n')
    c = load_config(p)
    assert c.workers == 3 and c.train.steps == 7 and c.transport.max_datagram_size == 1400
    c2 = override(c, train__steps=9, workers=None)
    assert c2.train.steps == 9 and c2.workers == 3
    j = tmp_path / "job.json"
    import json

    j.write_text(json.dumps(to_dict(c2)))
    assert load_config(j) == c2
    assert load_config(None) == JobConfig()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[train]\nstepz = 1\n", "train.stepz"),
        ("workers = 'two'\n", "workers must be int"),
        ("workers = 0\n", "workers must be in"),
        ("[train\n", "not valid TOML"),
        ("transport = 5\n", "must be a table"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text: str, match: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(p)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")
