"""Configuration errors: `inferwatch validate` against golden files.

Each tests/e2e/golden/NAME.yaml has a hand-written NAME.expected: one line per error that
`validate` must print, as `FILE:LINE:COL: KEY: MESSAGE-FRAGMENT` (`#` lines are comments).
An error line of the binary matches when it starts with `FILE:LINE:COL: KEY: ` and its
message contains the fragment. The binary must print exactly the expected errors (no more,
no fewer) and exit 2. Validation runs with the golden directory as the working directory and
the bare file name as --config, so FILE is the name as written.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.stem for p in GOLDEN.glob("*.yaml") if (GOLDEN / f"{p.stem}.expected").exists())

_ERR = re.compile(r"^(?P<loc>\S+:\d+:\d+): (?P<rest>.*)$")


def expected_lines(name: str) -> list[tuple[str, str, str]]:
    out = []
    for line in (GOLDEN / f"{name}.expected").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        loc, key, frag = line.split(": ", 2)
        out.append((loc, key, frag))
    return out


def error_lines(stderr: str) -> list[tuple[str, str]]:
    """(location, rest) of every located error line."""
    out = []
    for raw in stderr.splitlines():
        m = _ERR.match(raw.strip())
        if m:
            out.append((m.group("loc"), m.group("rest")))
    return out


def match(expected: list[tuple[str, str, str]], got: list[tuple[str, str]]) -> list[str]:
    """Problems matching expected errors one-to-one with the printed ones."""
    problems = []
    left = list(got)
    for loc, key, frag in expected:
        prefix = "" if key == "-" else f"{key}: "
        hit = next((g for g in left if g[0] == loc and g[1].startswith(prefix) and frag in g[1][len(prefix):]), None)
        if hit is None:
            problems.append(f"missing: {loc}: {key}: ...{frag}...")
        else:
            left.remove(hit)
    problems += [f"unexpected: {loc}: {rest}" for loc, rest in left]
    return problems


@pytest.fixture(autouse=True)
def _no_leaking_env(monkeypatch):
    monkeypatch.delenv("INFERWATCH_E2E_SURELY_UNSET_HOST", raising=False)
    monkeypatch.delenv("INFERWATCH_E2E_SURELY_UNSET_PORT", raising=False)


def test_golden_cases_exist():
    assert len(CASES) >= 10, CASES


@pytest.mark.parametrize("name", CASES)
def test_validate_golden(run_cli, name):
    r = run_cli("validate", "--config", f"{name}.yaml", cwd=GOLDEN)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    problems = match(expected_lines(name), error_lines(r.stderr))
    assert not problems, "\n".join(problems) + f"\n--- stderr ---\n{r.stderr}"


@pytest.mark.parametrize("name", ["unknown_component_key", "undefined_component"])
def test_run_with_bad_config_exits_2_with_the_same_errors(run_cli, name):
    r = run_cli("run", "--config", f"{name}.yaml", cwd=GOLDEN, timeout=20)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stderr}"
    assert not match(expected_lines(name), error_lines(r.stderr)), r.stderr


def test_absolute_path_is_reported_as_given(run_cli, tmp_path):
    cfg = tmp_path / "abs.yaml"
    shutil.copy(GOLDEN / "unknown_component_key.yaml", cfg)
    r = run_cli("validate", "--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}:11:5: exporters.otlp/tempo.compresion: " in r.stderr, r.stderr


PLAIN_OTELCOL = """\
receivers:  { otlp: { protocols: { grpc: { endpoint: 127.0.0.1:4317 }, http: {} } } }
processors: { batch: {}, memory_limiter: { check_interval: 1s, limit_mib: 512 } }
exporters:  { otlp/tempo: { endpoint: tempo:4317, tls: { insecure: true } }, debug: {} }
service:
  pipelines:
    traces: { receivers: [otlp], processors: [memory_limiter, batch], exporters: [otlp/tempo] }
"""


def test_plain_otelcol_config_is_valid(run_cli, tmp_path):
    (tmp_path / "otelcol.yaml").write_text(PLAIN_OTELCOL)
    r = run_cli("validate", "--config", "otelcol.yaml")
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout


def test_otlp_buffer_sizes_are_accepted_with_a_located_warning(run_cli, tmp_path):
    """otelcol's grpc read/write_buffer_size change nothing here: one located warning each, exit 0."""
    (tmp_path / "buffers.yaml").write_text(
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:4317\n"
        "        read_buffer_size: 524288\n        write_buffer_size: 0\n"
        "exporters: {debug: {}}\nservice:\n  pipelines:\n    traces: {receivers: [otlp], exporters: [debug]}\n")
    r = run_cli("validate", "--config", "buffers.yaml")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: buffers.yaml:6:9: receivers.otlp.protocols.grpc.read_buffer_size: has no effect: "
        "the gRPC server (tonic/hyper) sizes its connection buffers itself",
        "warning: buffers.yaml:7:9: receivers.otlp.protocols.grpc.write_buffer_size: has no effect: "
        "the gRPC server (tonic/hyper) sizes its connection buffers itself",
    ], r.stderr


def readme_examples() -> list[str]:
    """YAML blocks of the repository README that look like a whole agent configuration."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    if not readme.exists():
        return []
    blocks = re.findall(r"```ya?ml\n(.*?)```", readme.read_text(), re.S)
    return [b for b in blocks if "receivers:" in b and "service:" in b and "pipelines:" in b]


def test_readme_examples_are_valid(run_cli, tmp_path):
    examples = readme_examples()
    if not examples:
        pytest.skip("README.md has no complete configuration example")
    for i, text in enumerate(examples):
        (tmp_path / f"readme{i}.yaml").write_text(text)
        r = run_cli("validate", "--config", f"readme{i}.yaml")
        assert r.returncode == 0, f"README example {i} does not validate:\n{text}\n{r.stderr}"


def test_merged_files_report_the_file_that_is_wrong(run_cli, tmp_path):
    (tmp_path / "base.yaml").write_text(PLAIN_OTELCOL)
    (tmp_path / "override.yaml").write_text("exporters:\n  otlp/tempo:\n    endpoint: tempo:4317\n    timout: 5s\n")
    r = run_cli("validate", "--config", "base.yaml", "--config", "override.yaml")
    assert r.returncode == 2
    assert "override.yaml:4:5: exporters.otlp/tempo.timout: " in r.stderr, r.stderr
    (tmp_path / "fix.yaml").write_text("exporters:\n  otlp/tempo:\n    endpoint: tempo:4318\n    timeout: 5s\n")
    r = run_cli("validate", "--config", "base.yaml", "--config", "fix.yaml")
    assert r.returncode == 0, r.stderr


def test_env_vars_are_substituted(run_cli, tmp_path):
    text = PLAIN_OTELCOL.replace("tempo:4317", '"${env:INFERWATCH_E2E_TEMPO}"')
    (tmp_path / "env.yaml").write_text(text)
    r = run_cli("validate", "--config", "env.yaml", env={"INFERWATCH_E2E_TEMPO": "tempo.example:4317"})
    assert r.returncode == 0, r.stderr
    r = run_cli("validate", "--config", "env.yaml", env={"INFERWATCH_E2E_TEMPO": "no-port"})
    assert r.returncode == 2
    assert "env.yaml:3:" in r.stderr and "exporters.otlp/tempo.endpoint" in r.stderr, r.stderr


def test_yaml_syntax_error_is_located(run_cli, tmp_path):
    (tmp_path / "syntax.yaml").write_text("receivers:\n  otlp:\n    protocols: [grpc\nexporters:\n  debug:\n")
    r = run_cli("validate", "--config", "syntax.yaml")
    assert r.returncode == 2, r.stderr
    assert re.search(r"syntax\.yaml:\d+:\d+: ", r.stderr), r.stderr


def test_missing_file(run_cli):
    r = run_cli("validate", "--config", "does-not-exist.yaml")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "does-not-exist.yaml" in r.stderr


def test_components_lists_the_builtins(run_cli):
    r = run_cli("components")
    assert r.returncode == 0, r.stderr
    for name in ("otlp", "batch", "memory_limiter", "otlphttp", "debug", "forward", "health_check"):
        assert re.search(rf"\b{name}\b", r.stdout), f"{name} missing from:\n{r.stdout}"


def test_version(run_cli):
    r = run_cli("--version")
    assert r.returncode == 0
    assert re.match(r"inferwatch \d+\.\d+\.\d+", r.stdout.strip()), r.stdout


def test_default_pipeline_yaml_is_valid(run_cli):
    """`inferwatch validate` with no --config reads pipeline.yaml from the working directory."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pipeline.yaml").exists():
        pytest.skip("no pipeline.yaml")
    r = run_cli("validate", cwd=root)
    assert r.returncode == 0, r.stderr


# ---- config memory: alias budget in bytes, file-size cap (issue 15) ------------------------

def _run_measured(inferwatch_bin: str, *args: str, cwd: Path, timeout: float = 20) -> tuple[int, str, float, int]:
    """Runs the binary in a fresh Python so RUSAGE_CHILDREN is the agent's own peak RSS:
    (exit code, stderr, seconds, peak RSS in KiB)."""
    import json
    import subprocess
    import sys

    probe = (
        "import json,resource,subprocess,sys,time\n"
        "t=time.monotonic()\n"
        "p=subprocess.run(sys.argv[1:],capture_output=True,text=True,stdin=subprocess.DEVNULL)\n"
        "print(json.dumps([p.returncode,p.stderr,time.monotonic()-t,"
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, inferwatch_bin, *args], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd)
    rc, err, took, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return rc, err, took, rss


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_aliased_megabyte_scalar_is_refused_by_the_byte_budget(inferwatch_bin, tmp_path, cmd):
    """A 1 MiB scalar aliased 4,000 times (4 GiB expanded; 4.2 GiB RSS for 8.3 s before) is
    refused with exit 2 at the alias that crosses the 16 MiB budget, fast and small."""
    lines = [f"big: &big {'x' * (1 << 20)}", "exporters:", "  debug:", "    list:"]
    lines += ["      - *big"] * 4000
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    rc, err, took, rss_kib = _run_measured(inferwatch_bin, cmd, "--config", "bomb.yaml", cwd=tmp_path)
    print(f"alias bomb ({cmd}): exit {rc} in {took:.3f}s, peak RSS {rss_kib / 1024:.0f} MiB")
    assert rc == 2, err
    # The 17th alias crosses 16 MiB: line 4 + 17, column 9 (the `*`).
    assert not match([("bomb.yaml:21:9", "exporters.debug.list[16]", "MiB of text")], error_lines(err)), err
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_endless_config_file_is_read_with_a_cap(inferwatch_bin, tmp_path, cmd):
    """`--config /dev/zero` was read until memory ran out; now 16 MiB are read and refused."""
    rc, err, took, rss_kib = _run_measured(inferwatch_bin, cmd, "--config", "/dev/zero", cwd=tmp_path)
    print(f"/dev/zero ({cmd}): exit {rc} in {took:.3f}s, peak RSS {rss_kib / 1024:.0f} MiB")
    assert rc == 2, err
    assert "/dev/zero" in err and "larger than the 16 MiB" in err, err
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"
    # A regular file over the cap too; one just under it is read (and here is not YAML-valid
    # as a configuration, which is a different error).
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (16 * 1024 * 1024 + 1))
    rc, err, _, _ = _run_measured(inferwatch_bin, cmd, "--config", "big.yaml", cwd=tmp_path)
    assert rc == 2 and "larger than the 16 MiB" in err, err
