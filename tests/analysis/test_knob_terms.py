"""The built-in trainer's knobs in each framework's own terms (recprof/analysis/frameworks.py):
every knob is said in every framework, TorchRec's settings are real TorchRec (checked by
building them with TorchRec itself), a knob TorchRec cannot do says so with its closest lever,
and the translations name the same framework knobs as the findings' remedies."""

from __future__ import annotations

import re

import pytest

from recprof.analysis.frameworks import (
    BALANCE,
    LOCALITY,
    OVERLAP,
    REMEDIES,
    SHRINK,
    knob_setting,
    terms_name,
)
from recprof.nestpipe.knobs import KNOBS

#: A value of each knob that is not the baseline's (what a recommendation would change).
CHANGED = {"micro_batches": 4, "hsp_groups": 2, "qcomms": "fp16", "reshape": 2, "dbp": True,
           "clustering": True, "sharding": "table", "fuse_tables": False}


def test_every_knob_of_the_trainer_is_said_in_every_framework() -> None:
    assert set(CHANGED) == set(KNOBS)  # a new knob must get a value here, and terms below
    for framework in ("torchrec", "ddp", "unknown", "nestpipe"):
        for device in ("cpu", "cuda"):
            for knob, value in CHANGED.items():
                setting = knob_setting(framework, knob, value, device)
                assert setting.setting and "in the mirror's trainer config" not in setting.setting
                line = setting.line()
                assert line.startswith(f"{knob}={value} -> ")
                assert ("no counterpart; closest lever: " in line) == (not setting.counterpart)


def test_the_built_in_trainer_is_its_own_config() -> None:
    setting = knob_setting("nestpipe", "qcomms", "bf16", "cpu")
    assert setting.counterpart and setting.setting == "qcomms: bf16 in the trainer config"
    assert terms_name("torchrec") == "TorchRec's"
    assert terms_name("unknown").startswith("a hand-written job's")


def _torchrec_namespace() -> dict[str, object]:
    pytest.importorskip("torchrec")
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType

    return {"CommType": CommType, "QCommsConfig": QCommsConfig,
            "ParameterConstraints": ParameterConstraints, "ShardingType": ShardingType}


@pytest.mark.parametrize(("value", "device", "sent"), [
    ("fp16", "cpu", "FP16"), ("bf16", "cpu", "BF16"), ("bf16", "cuda", "BF16"),
    ("fp8", "cuda", "FP8")])
def test_torchrec_qcomms_settings_build_in_torchrec(value: str, device: str, sent: str) -> None:
    names = _torchrec_namespace()
    setting = knob_setting("torchrec", "qcomms", value, device)
    assert setting.counterpart
    expression = re.search(r"QCommsConfig\([^()]*\)", setting.setting)
    assert expression is not None, setting.setting
    config = eval(expression.group(0), names)  # TorchRec builds what the answer tells users
    comm_type = names["CommType"]
    assert config.forward_precision == config.backward_precision == getattr(comm_type, sent)
    assert "get_qcomm_codecs_registry(" in setting.setting
    assert "EmbeddingBagCollectionSharder(qcomm_codecs_registry=" in setting.setting


def test_what_torchrec_cannot_do_on_cpu_names_the_closest_lever() -> None:
    """Seen here (shared/docs/field-notes.md): QComms FP8 fails on CPU, BF16 goes as FP16,
    row-wise sharding is refused on gloo, DMPCollection is CUDA-only."""
    fp8 = knob_setting("torchrec", "qcomms", "fp8", "cpu")
    assert not fp8.counterpart and "CommType.FP16" in fp8.setting and "FP8 fails on CPU" in fp8.note
    assert "sends BF16 as FP16" in knob_setting("torchrec", "qcomms", "bf16", "cpu").note
    row = knob_setting("torchrec", "sharding", "row", "cpu")
    assert not row.counterpart and "ShardingType.COLUMN_WISE" in row.setting
    assert knob_setting("torchrec", "sharding", "row", "cuda").counterpart
    assert not knob_setting("torchrec", "hsp_groups", 2, "cpu").counterpart
    assert "DMPCollection(" in knob_setting("torchrec", "hsp_groups", 2, "cuda").setting
    micro = knob_setting("torchrec", "micro_batches", 4, "cuda")
    assert not micro.counterpart and micro.setting.startswith("TrainPipelineSemiSync")
    assert not knob_setting("torchrec", "fuse_tables", False, "cpu").counterpart


def test_torchrec_sharding_settings_build_in_torchrec() -> None:
    names = _torchrec_namespace()
    for value, device, kind in (("table", "cpu", "TABLE_WISE"), ("row", "cuda", "ROW_WISE"),
                                ("row", "cpu", "COLUMN_WISE")):
        setting = knob_setting("torchrec", "sharding", value, device).setting
        expression = re.search(r"ParameterConstraints\(.*?\]\)", setting)
        assert expression is not None, setting
        built = eval(expression.group(0), names)
        assert built.sharding_types == [getattr(names["ShardingType"], kind).value]


@pytest.mark.parametrize(("knob", "value", "mechanism", "device"), [
    ("qcomms", "fp16", SHRINK, "cuda"), ("micro_batches", 4, OVERLAP, "cuda"),
    ("hsp_groups", 2, LOCALITY, "cuda"), ("sharding", "row", BALANCE, "cuda")])
def test_torchrec_terms_use_the_remedies_vocabulary(knob: str, value: object, mechanism: str,
                                                    device: str) -> None:
    """A finding that asks for `mechanism` names these TorchRec knobs; the answer for the
    trainer knob that acts that way names one of them too (one vocabulary for both)."""
    remedy_names = {name.split(".")[0].split(" ")[0]
                    for name in REMEDIES["torchrec"][mechanism].knobs}
    setting = knob_setting("torchrec", knob, value, device).setting
    assert any(name in setting for name in remedy_names), (remedy_names, setting)


def test_hand_written_jobs_get_code_changes_and_ddp_its_no_sync() -> None:
    ddp = knob_setting("ddp", "micro_batches", 4, "cpu").setting
    plain = knob_setting("unknown", "micro_batches", 4, "cpu").setting
    assert "no_sync()" in ddp and "no_sync()" not in plain
    assert "all_to_all_single(async_op=True)" in plain
    fp16 = knob_setting("ddp", "qcomms", "fp16", "cpu").setting
    assert "torch.float16" in fp16 and "dist.all_to_all_single" in fp16
    assert "gloo rejects float8" in knob_setting("ddp", "qcomms", "fp8", "cpu").note
    assert knob_setting("ddp", "qcomms", "fp8", "cuda").note == ""
