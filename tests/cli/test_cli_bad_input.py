"""Hostile input to the CLI (issue 11, item 3): every case exits 2 with a short message, no traceback, bounded.

The table runs ``weightbridge.cli.main.main(argv)`` in-process (each case under a SIGALRM deadline);
a few cases run the real ``python -m weightbridge`` in a subprocess: the alias bomb with its peak
RSS measured in the child, and end-to-end checks that the interpreter prints no traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from weightbridge.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY_TEXT = (ROOT / "spec" / "examples" / "tiny_fsdp2_to_vllm.yaml").read_text()
BIG = "x" * 5_000_000  # a 5 MB argument (in-process only: exec limits one argument to 128 KiB)
NO_SIZES = "gives no num_hidden_layers, hidden_size, vocab_size"
SPEC_LINE = re.compile(r"^\S.*:\d+: \$[^\s:]*: \S")  # file:line: $.path: message

# An 800-byte "billion laughs": 9 levels of 9 aliases each = 9**9 scalars once expanded.
BOMB = "version: 1\nmodel:\n  params:\n" + "".join(
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(10)
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("hostile")
    (d / "adir").mkdir()
    (d / "plain.txt").write_text("not a directory\n")
    (d / "qwen_only.json").write_text(json.dumps({"model_type": "qwen2"}))
    specs = {
        "tiny.yaml": TINY_TEXT,
        "deep_flow.yaml": "version: 1\nmodel: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "deep_block.yaml": "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 2000)) + "  " * 2000 + "c\n",
        "bomb.yaml": BOMB,
        "cycle.yaml": "version: 1\nmodel: &a {params: *a}\n",
        "rb1.yaml": TINY_TEXT.replace("round_bytes: 64MiB", "round_bytes: 1"),
        "rb_tiny_units.yaml": (
            "version: 1\nmodel:\n  tensors:\n  - {name: w, shape: [1048576, 65536], dtype: bfloat16}\n"
            "trainer: {preset: hf}\nrollout: {preset: hf}\nsync: {round_bytes: 4KiB}\n"
        ),
        "rb_units_1gib.yaml": (
            "version: 1\nmodel:\n  tensors:\n  - {name: w, shape: [1048576, 65536], dtype: bfloat16}\n"
            "trainer: {preset: hf}\nrollout: {preset: hf}\nsync: {round_bytes: 1GiB}\n"
        ),
        "config_only.yaml": (
            "version: 1\nmodel: {config: qwen_only.json}\n"
            "trainer: {preset: fsdp2, mesh: {dp: 2}}\nrollout: {preset: vllm, mesh: {tp: 2}}\n"
        ),
        "huge_mesh.yaml": TINY_TEXT.replace("mesh: {dp: 2}", "mesh: {dp: 1000000000}"),
        "huge_int.yaml": TINY_TEXT.replace("mesh: {dp: 2}", "mesh: {dp: " + "9" * 5000 + "}"),
        "bad_date.yaml": TINY_TEXT + "network: 2001-13-45\n",
        "list_key.yaml": TINY_TEXT + "? [a, b]\n: 1\n",
        "long_value.yaml": TINY_TEXT.replace("preset: vllm", "preset: " + "v" * 100_000),
    }
    for name, text in specs.items():
        (d / name).write_text(text)
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01binary\x00" * 10)
    (d / "latin1.yaml").write_bytes("version: 1\nmodel: {bundled: tiny-qwen2}\n# caf\xe9\n".encode("latin-1"))
    (d / "deep.json").write_text("[" * 10_000 + "]" * 10_000)
    (d / "binary.json").write_bytes(b"\xff\xfe\x00\x01")
    from weightbridge.spec.resolve import check_text

    (d / "rollout0.json").write_text(json.dumps(check_text(TINY_TEXT)[0].rollout.ranks[0].to_json()))  # a good probe
    out = {k: str(d / k) for k in [*specs, "binary.yaml", "latin1.yaml", "deep.json", "binary.json", "adir",
                                     "plain.txt", "qwen_only.json", "rollout0.json"]}
    out["dir"] = str(d)
    return out


class _Timeout(Exception):
    pass


@contextmanager
def deadline(seconds: int):
    def fire(*_: object) -> None:
        raise _Timeout(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], seconds: int = 60) -> tuple[int, str, str]:
    capsys.readouterr()
    with deadline(seconds):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return rc, out, err


# (id, argv with {name} placeholders for the fixture's files, expected stderr fragment, is a spec error)
T = "{tiny.yaml}"
CASES: list[tuple[str, list[str], str, bool]] = [
    # unreadable spec files
    ("binary-spec", ["validate", "{binary.yaml}"], "not UTF-8 text", True),
    ("latin1-spec", ["validate", "{latin1.yaml}"], "not UTF-8 text", True),
    ("binary-spec-plan", ["plan", "{binary.yaml}"], "not UTF-8 text", True),
    ("binary-spec-explain", ["explain", "{binary.yaml}", "--side", "trainer", "--rank", "0"], "not UTF-8 text", True),
    ("binary-spec-diff", ["diff", "{binary.yaml}:trainer:0", T + ":trainer:0"], "not UTF-8 text", False),
    ("dir-as-spec", ["validate", "{adir}"], "Is a directory", False),
    # YAML bombs and pathological structure
    ("deep-flow", ["validate", "{deep_flow.yaml}"], "nesting deeper than 64 levels", True),
    ("deep-block", ["plan", "{deep_block.yaml}"], "nesting deeper than 64 levels", True),
    ("deep-diff", ["diff", "{deep_flow.yaml}:trainer:0", T + ":trainer:0"], "nesting deeper", False),
    ("alias-bomb", ["validate", "{bomb.yaml}"], "aliases expand to more than", True),
    ("alias-cycle", ["validate", "{cycle.yaml}"], "(a cycle)", True),
    ("huge-int", ["validate", "{huge_int.yaml}"], "cannot read the value", True),
    ("bad-date", ["validate", "{bad_date.yaml}"], "month must be in 1..12", True),
    ("list-key", ["validate", "{list_key.yaml}"], "a mapping key must be a scalar", True),
    ("huge-mesh", ["validate", "{huge_mesh.yaml}"], "at most 65,536 per side", True),
    # round_bytes
    ("round-bytes-1-spec", ["plan", "{rb1.yaml}"], "below the minimum of 4096 bytes", True),
    ("round-bytes-too-fine", ["validate", "{rb_tiny_units.yaml}"], "the planner takes at most", True),
    ("round-bytes-neg", ["plan", T, "--round-bytes", "-5"], "--round-bytes: expected at least 4096", False),
    ("round-bytes-0", ["plan", T, "--round-bytes", "0"], "--round-bytes: expected at least 4096", False),
    ("round-bytes-1", ["plan", T, "--round-bytes", "1"], "--round-bytes: expected at least 4096", False),
    ("round-bytes-word", ["plan", T, "--round-bytes", "lots"], "--round-bytes: expected bytes", False),
    ("round-bytes-arg-too-fine", ["plan", "{rb_units_1gib.yaml}", "--round-bytes", "4096"],
     "--round-bytes: round_bytes 4096 cuts one update", False),
    ("max-problems-neg", ["plan", T, "--max-problems", "-1"], "expected an integer >= 0", False),
    ("diff-limit-neg", ["diff", T + ":trainer:0", T + ":trainer:1", "--limit", "-1"], "expected an integer >= 0",
     False),
    # demo arguments (errors on stderr, nothing on stdout: checked below)
    ("demo-timeout-neg", ["demo", "--timeout", "-1"], "--timeout: expected a finite number > 0", False),
    ("demo-timeout-nan", ["demo", "--timeout", "nan"], "--timeout: expected a finite number > 0", False),
    ("demo-timeout-inf", ["demo", "--timeout", "inf"], "--timeout: expected a finite number > 0", False),
    ("demo-steps-0", ["demo", "--steps", "0"], "--steps: expected an integer >= 1", False),
    ("demo-modes", ["demo", "--modes", "fast"], "--modes: takes sync and/or async", False),
    # NUL bytes and over-long paths
    ("nul-spec", ["validate", "a\0b.yaml"], "NUL byte", False),
    ("nul-plan", ["plan", "a\0b.yaml"], "NUL byte", False),
    ("long-spec", ["validate", "a" * 5000 + ".yaml"], "File name too long", False),
    ("long-explain", ["explain", "a" * 5000, "--side", "trainer", "--rank", "0"], "File name too long", False),
    ("nul-models", ["models", "a\0b"], "NUL byte", False),
    ("long-models", ["models", "a" * 5000], "path too long", False),
    ("nul-diff", ["diff", "a\0b.json", T + ":trainer:0"], "NUL byte", False),
    ("long-diff", ["diff", "a" * 5000 + ".json", T + ":trainer:0"], "too long for a path", False),
    ("long-name-diff", ["diff", "a" * 300 + ".json", T + ":trainer:0"], "File name too long", False),
    ("long-name-spec", ["validate", "a" * 300 + ".yaml"], "File name too long", False),
    ("nul-render", ["plan", T, "--render", "x\0.png"], "NUL byte", False),
    ("nul-probe-out", ["probe", T, "--loader", "m:f", "-o", "x\0.json"], "NUL byte", False),
    # output paths that cannot be written (checked before any work)
    ("render-dir", ["plan", T, "--render", "{adir}"], "is a directory", False),
    ("render-no-dir", ["plan", T, "--render", "{dir}/missing/x.png"], "does not exist", False),
    ("render-under-file", ["plan", T, "--render", "{plain.txt}/x.png"], "is not a directory", False),
    ("render-format", ["plan", T, "--render", "{dir}/x.txt"], "use a .png, .svg, .pdf file name", False),
    ("fit-probe-form", ["fit", T, "--side", "rollout", "--probe", "x=y"], "expected RANK=PROBE.json", False),
    ("fit-probe-not-json", ["fit", T, "--side", "rollout", "--probe", "0={binary.json}"], "not a probe JSON", False),
    ("fit-probe-deep", ["fit", T, "--side", "rollout", "--probe", "0={deep.json}"], "not a probe JSON", False),
    ("fit-probe-dir", ["fit", T, "--side", "rollout", "--probe", "0={adir}"], "not a probe JSON", False),
    ("fit-binary-spec", ["fit", "{binary.yaml}", "--side", "rollout", "--probe", "0={deep.json}"], "cannot read", False),
    ("fit-invalid-spec", ["fit", "{huge_mesh.yaml}", "--side", "rollout", "--probe", "0={rollout0.json}"],
     "problem(s) found", True),
    ("fit-out-dir", ["fit", T, "--side", "rollout", "--probe", "0={deep.json}", "-o", "{adir}"], "is a directory", False),
    ("probe-out-dir", ["probe", T, "--loader", "m:f", "-o", "{adir}"], "is a directory", False),
    ("probe-out-no-dir", ["probe", T, "--loader", "m:f", "-o", "{dir}/missing/x.json"], "does not exist", False),
    ("probe-loader-relative", ["probe", T, "--loader", ".m:f", "-o", "{dir}/p.json"], "expected MODULE:FACTORY", False),
    ("probe-max-bytes-neg", ["probe", T, "--loader", "m:f", "--max-probe-bytes", "-3", "-o", "{dir}/p.json"],
     "expected an integer >= 1", False),
    # 5 MB values are echoed as a short excerpt
    ("glob-5mb", ["explain", T, "--side", "trainer", "--rank", "0", "--tensor", BIG], "a glob of 5,000,000 characters",
     False),
    ("choice-5mb", ["presets", BIG], "(5000", False),
    ("dtype-5mb", ["models", "tiny-qwen2", "--dtype", BIG], "(5000000 chars)", False),
    ("modes-5mb", ["demo", "--modes", BIG], "chars)", False),
    ("loader-5mb", ["probe", T, "--loader", BIG, "-o", "{dir}/p.json"], "(5000000 chars)", False),
    ("models-5mb", ["models", BIG], "path too long", False),
    ("value-100k-in-spec", ["validate", "{long_value.yaml}"], "(100000 chars)", True),
    # JSON inputs
    ("models-deep-json", ["models", "{deep.json}"], "nested too deeply", False),
    ("models-binary-json", ["models", "{binary.json}"], "cannot read", False),
    ("diff-deep-json", ["diff", "{deep.json}", T + ":trainer:0"], "nested too deeply", False),
    # a config that gives no sizes would silently become transformers' default model
    ("config-no-sizes-models", ["models", "{qwen_only.json}"], NO_SIZES, False),
    ("config-no-sizes-spec", ["validate", "{config_only.yaml}"], NO_SIZES, True),
]


def _fill(argv: list[str], files: dict[str, str]) -> list[str]:
    return [re.sub(r"\{([^{}\0]+)\}", lambda m: files[m.group(1)], a) if len(a) < 10_000 else a for a in argv]


@pytest.mark.parametrize(("argv", "fragment", "spec_error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_a_short_message(
    argv: list[str], fragment: str, spec_error: bool, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(os.listdir(files["dir"])), sorted(os.listdir(files["adir"]))
    t0 = time.monotonic()
    rc, out, err = run_cli(_fill(argv, files), capsys)
    assert rc == 2, (rc, out[-2000:], err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert fragment in err, err[-2000:]
    assert len(err) < 4000 and len(out) < 4000, (len(err), len(out))  # bounded echo of 5 MB values
    if argv[0] in ("demo", "validate", "explain", "probe", "diff", "models", "presets") or "--render" in argv:
        assert out == "", out[-2000:]  # errors go to stderr only
    if spec_error:
        assert SPEC_LINE.match(err), err[:500]
    assert (sorted(os.listdir(files["dir"])), sorted(os.listdir(files["adir"]))) == before  # nothing written
    assert time.monotonic() - t0 < 60


def test_render_writes_and_names_the_exact_path(files: dict[str, str], tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "plot"  # no suffix: .png is added, and said
    rc, out, err = run_cli(["plan", files["tiny.yaml"], "--render", str(target)], capsys)
    assert rc == 0, err
    assert f"rendered {target}.png" in out.replace("\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]  # no temporary file left behind


def test_a_bug_is_an_internal_error_not_a_traceback(monkeypatch, capsys) -> None:
    import weightbridge.cli.presets_cmd as presets_cmd

    def boom(*_: object) -> None:
        raise RuntimeError("x" * 10_000)

    monkeypatch.setattr(presets_cmd, "load_preset", boom)
    rc, _, err = run_cli(["presets"], capsys)
    assert rc == 3 and "internal error: RuntimeError" in err and "Traceback" not in err and len(err) < 1000


# ---- the real interpreter -------------------------------------------------------------------------

# Peak RSS of the child itself: VmHWM belongs to the new address space (ru_maxrss would carry the
# pytest parent's peak across exec on Linux).
_PEAK_RSS = (
    "import re, resource, sys\n"
    "from weightbridge.cli.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "try:\n"
    "    kb = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    "except OSError:\n"
    "    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print('PEAK_RSS_KB', kb, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _subprocess(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_alias_bomb_bounded_memory_and_time(files: dict[str, str], command: str) -> None:
    assert len(BOMB.encode()) < 1000
    t0 = time.monotonic()
    proc = _subprocess(["-c", _PEAK_RSS, command, files["bomb.yaml"]])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "aliases expand to more than" in proc.stderr
    assert SPEC_LINE.match(proc.stderr), proc.stderr[:300]
    peak_mb = int(re.search(r"PEAK_RSS_KB (\d+)", proc.stderr).group(1)) / 1024  # type: ignore[union-attr]
    assert peak_mb < 300, peak_mb
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["validate", "{deep_flow.yaml}"], "nesting deeper than 64 levels"),
        (["validate", "{binary.yaml}"], "not UTF-8 text"),
        (["plan", "{rb1.yaml}"], "below the minimum"),
        (["demo", "--timeout", "-1"], "--timeout"),
    ],
    ids=["deep", "binary", "round-bytes-1", "demo-timeout"],
)
def test_end_to_end_no_traceback(files: dict[str, str], argv: list[str], fragment: str) -> None:
    proc = _subprocess(["-m", "weightbridge", *_fill(argv, files)])
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout[-1000:])
    assert "Traceback" not in proc.stderr and fragment in proc.stderr, proc.stderr[-2000:]
