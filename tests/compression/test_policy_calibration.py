"""Calibrated q (docs/POLICIES.md, "Calibrated q"): the progress-table file, and the netsense
policy pricing the levels it names at their figures for the whole run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from netsense.compression.policy import ChooseRequest, NetsensePolicy, make_policy
from netsense.compression.policy.calibration import (
    FORMAT,
    parse_progress_table,
    progress_settings,
    progress_table_json,
    read_progress_table,
)
from netsense.compression.policy.ladder import Ladder
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.progress import ProgressEstimate
from netsense.errors import ConfigError

LADDER = Ladder.parse("fp32,fp16,powersgd:4,topk:0.01+fp16")
S = 45_000_000  # 45 MB of fp32 gradients
MBIT = 1e6 / 8


def choose(p: NetsensePolicy, mbit: float, step: int = 0) -> int | None:
    link = LinkState(time_s=float(step), bandwidth_Bps=mbit * MBIT, min_rtt_s=0.02, srtt_s=0.02)
    return p.choose(ChooseRequest(link=link, payload_bytes=S, compute_s=0.5, step=step)).level


def test_a_pinned_level_is_moved_by_neither_rounds_nor_windows() -> None:
    est = ProgressEstimate(LADDER)
    est.pin(2, 0.8)
    est.update(2, 0.3)
    est.update_window(2, 0.2)
    est.update_window(2, 0.2, interim=True)
    assert est[2] == 0.8 and est.measured[2] and est.pinned[2]
    est.update(3, 0.3)  # a level the table does not name is estimated as before
    assert est[3] == 0.3 and not est.pinned[3]
    est.pin(3, 1.4)  # a trial may read above 1 (the level beat fp32 by chance): q is capped
    assert est[3] == 1.0
    est.pin(3, 0.0)  # ... or 0 (no progress in K steps): the floor keeps P / q finite
    assert est[3] == est.floor


def test_the_table_prices_a_level_from_the_first_decision() -> None:
    """Before any round PowerSGD carries its worst-case prior (0.05): at 20 Mbit/s with 45 MB of
    gradients the law cannot pick it. Calibrated at 0.9 it wins the first decision with a bandwidth."""
    plain = make_policy("netsense", LADDER)
    calibrated = make_policy("netsense", LADDER, progress_table={"powersgd:4": 0.9})
    assert isinstance(plain, NetsensePolicy) and isinstance(calibrated, NetsensePolicy)
    assert plain.progress[2] < 0.1
    assert choose(plain, 20) != 2
    assert choose(calibrated, 20) == 2
    calibrated.observe_progress(level=2, progress=0.1)  # a round's one-step figure does not move it
    assert calibrated.progress[2] == 0.9


def test_windows_leave_out_pinned_levels() -> None:
    p = make_policy("netsense", LADDER, progress_table={"powersgd:4": 0.9})
    assert isinstance(p, NetsensePolicy)
    levels, window = p.progress_window(0)
    assert 2 not in levels and 3 in levels and window == p.settings.progress_window


def test_table_specs_are_matched_in_canonical_form_and_unknown_ones_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        p = make_policy("netsense", LADDER, progress_table={"topk:0.01+fp16": 0.5, "qsgd:4": 0.9, "fp32": 0.5})
    assert isinstance(p, NetsensePolicy)
    assert p.progress[3] == 0.5 and p.progress.pinned == [False, False, False, True]  # fp32 is lossless: 1 stays
    assert "qsgd:4 not on the ladder" in caplog.text


@pytest.mark.parametrize(
    "table, words",
    [
        ({"powersgd:4": -0.1}, "level spec -> finite q >= 0"),
        ({"powersgd:4": float("nan")}, "level spec -> finite q >= 0"),
        ({"powersgd:4": True}, "level spec -> finite q >= 0"),
        ([("powersgd:4", 0.5)], "a mapping of level spec to q"),
    ],
)
def test_bad_tables_are_config_errors(table: object, words: str) -> None:
    with pytest.raises(ConfigError, match="progress_table") as err:
        make_policy("netsense", LADDER, progress_table=table)
    assert words in str(err.value)


def test_the_file_round_trips_per_direction(tmp_path: Path) -> None:
    text = progress_table_json({"up": {"powersgd:4": 0.91234}, "down": {"powersgd:4": 0.8}}, {"model": "m", "trial_steps": 60})
    data = json.loads(text)
    assert data["format"] == FORMAT and data["model"] == "m" and data["up"] == {"powersgd:4": 0.9123}
    path = tmp_path / "q.json"
    path.write_text(text)
    assert read_progress_table(path, "down") == {"powersgd:4": 0.8}
    assert progress_settings(path, "up", "netsense") == {"progress_table": {"powersgd:4": 0.9123}}
    assert progress_settings(None, "up", "netsense") is None
    assert progress_settings(path, "up", "fixed:powersgd:4") is None  # only netsense reads a table
    assert parse_progress_table({"format": FORMAT, "up": {"qsgd:4": 1}}, "down") == {}  # nothing calibrated that way


@pytest.mark.parametrize(
    "content, words",
    [
        ("{", "cannot read it"),
        (json.dumps({"up": {}}), "not a progress table"),
        (json.dumps({"format": FORMAT, "up": [1, 2]}), "'up' must be a table"),
        (json.dumps({"format": FORMAT, "up": {"qsgd:4": -1}}), "up.qsgd:4 must be a finite q >= 0, got -1"),
        (json.dumps({"format": FORMAT, "up": {"qsgd:4": "0.5"}}), "must be a finite q >= 0"),
    ],
)
def test_bad_files_are_one_config_error_naming_the_file(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "q.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="q.json") as err:
        read_progress_table(path, "up")
    assert words in str(err.value)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_progress_table(tmp_path / "absent.json", "up")
    with pytest.raises(ValueError, match="direction"):
        progress_table_json({"sideways": {}}, {})


def test_a_calibrated_level_does_not_become_the_unknown_bandwidth_level() -> None:
    """The table prices progress, not whether a level's sends measure the link: qsgd:4 at 1.00
    stays off the unknown-bandwidth rule, which keeps to what the rounds measured lossless."""
    ladder = Ladder.parse("fp32,fp16,qsgd:8,qsgd:4,powersgd:4")
    p = make_policy("netsense", ladder, progress_table={"qsgd:4": 1.0, "powersgd:4": 0.9})
    assert isinstance(p, NetsensePolicy)
    assert p.progress[3] == 1.0 and p.safe_level() == 1  # fp16 until the 8-bit level is measured
    p.observe_progress(level=2, progress=1.0)  # the first round measures qsgd:8 lossless
    assert p.safe_level() == 2
    link = LinkState(time_s=0.0, bandwidth_Bps=None, min_rtt_s=0.02, srtt_s=0.02)
    assert p.choose(ChooseRequest(link=link, payload_bytes=S, compute_s=0.0, step=0)).level == 2
