"""ci/run-action.py: action.yml's steps run here in the runner's order, with its contexts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "ci" / "run-action.py"


def harness(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True,
                          text=True, cwd=cwd, check=False, timeout=60)  # fmt: skip


def write_action(tmp_path: Path, steps: list[dict[str, object]], **inputs: object) -> Path:
    action = tmp_path / "action" / "action.yml"
    action.parent.mkdir()
    spec = {"name": "t", "description": "a throwaway action", "inputs": inputs,
            "runs": {"using": "composite", "steps": steps}}  # fmt: skip
    action.write_text(yaml.safe_dump(spec, sort_keys=False))
    return action


def test_dry_run_lists_action_yml_steps_in_order_with_inputs_substituted(tmp_path: Path) -> None:
    got = harness("--dry-run", "--work", str(tmp_path), "--input", "subject=plugin/subject.yaml",
                  "--input", "args=-k xid_79", "--input", "kubernetes-version=v1.34.0",
                  "--input", "kubelet-version=v1.33.4")  # fmt: skip
    assert got.returncode == 0, got.stderr
    steps = yaml.safe_load((REPO / "action.yml").read_text())["runs"]["steps"]
    titles = [s.get("name") or s["uses"] for s in steps]
    listed = re.findall(r"^(\d+)\. (.+?)(?:  \[if .*)?$", got.stdout, re.M)
    assert [t for _, t in listed] == titles
    assert [int(n) for n, _ in listed] == list(range(1, len(titles) + 1))
    assert "env SUBJECT_FILE=plugin/subject.yaml" in got.stdout
    assert "env E2E_ARGS_IN=-k xid_79" in got.stdout
    assert "env GPULAB_KUBE_VERSION=v1.34.0" in got.stdout
    assert "env GPULAB_KUBELET_VERSION=v1.33.4" in got.stdout
    # Step outputs are not known before the run; the runner's own contexts are.
    assert "with key: gpulab-infra-Linux-<steps.prep.outputs.key>" in got.stdout
    assert not (tmp_path / "temp").exists(), "a dry run wrote its work directory"


def test_dry_run_marks_the_cache_steps_skipped_without_the_cache(tmp_path: Path) -> None:
    got = harness("--dry-run", "--work", str(tmp_path), "--input", "subject=s.yaml",
                  "--input", "infra-cache=false")  # fmt: skip
    assert got.returncode == 0, got.stderr
    restore = next(line for line in got.stdout.splitlines() if "Restore gpulab's" in line)
    assert restore.endswith("(skipped)")


def test_a_missing_required_input_is_refused_in_one_line() -> None:
    got = harness("--dry-run")
    assert got.returncode == 2
    err = got.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("run-action: error: input subject is required"), err


def test_an_action_it_cannot_emulate_is_refused_in_one_line_before_any_step(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    action = write_action(tmp_path, [
        {"name": "first", "shell": "bash", "run": f"touch {marker}"},
        {"uses": "docker/login-action@v3"},
    ])  # fmt: skip
    got = harness("--action", str(action), "--work", str(tmp_path / "w"))
    assert got.returncode == 2
    err = got.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "step 2 (docker/login-action@v3): uses docker/login-action@v3" in err
    assert "cannot run" in err
    assert not marker.exists(), "a step ran before the refusal"


def test_step_outputs_pass_from_one_run_step_to_the_next(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    action = write_action(
        tmp_path,
        [
            {"id": "make", "shell": "bash",
             "run": 'echo "word=${{ inputs.greeting }}-$RUNNER_OS" >>"$GITHUB_OUTPUT"\n'
                    'printf "text<<EOF\\nline 1\\nline 2\\nEOF\\n" >>"$GITHUB_OUTPUT"\n'
                    'echo "FROM_ENV=set" >>"$GITHUB_ENV"'},
            {"id": "skipped", "if": "steps.make.outputs.word == 'nope'", "shell": "bash",
             "run": "exit 1"},
            {"name": "use", "shell": "bash",
             "env": {"TEXT": "${{ steps.make.outputs.text }}"},
             "run": f'printf "%s|%s|%s|%s" "${{{{ steps.make.outputs.word }}}}" "$TEXT" '
                    f'"$FROM_ENV" "${{{{ steps.skipped.outcome }}}}" >{out}'},
        ],
        greeting={"description": "a word", "default": "hello"},
    )  # fmt: skip
    got = harness("--action", str(action), "--work", str(tmp_path / "w"))
    assert got.returncode == 0, got.stdout + got.stderr
    assert out.read_text() == "hello-Linux|line 1\nline 2|set|skipped"


def test_a_failing_step_skips_the_rest_but_always_steps(tmp_path: Path) -> None:
    log = tmp_path / "log"
    action = write_action(tmp_path, [
        {"name": "fails", "shell": "bash", "run": "false"},
        {"name": "next", "shell": "bash", "run": f"echo next >>{log}"},
        {"name": "cleanup", "if": "always()", "shell": "bash", "run": f"echo always >>{log}"},
        {"name": "on failure", "if": "failure()", "shell": "bash", "run": f"echo failed >>{log}"},
    ])  # fmt: skip
    got = harness("--action", str(action), "--work", str(tmp_path / "w"))
    assert got.returncode == 1
    assert log.read_text() == "always\nfailed\n"


def test_the_emulated_cache_misses_then_hits_and_uploads_copy_files(tmp_path: Path) -> None:
    data, restored = tmp_path / "data", tmp_path / "restored"
    steps = [
        {"id": "restore", "uses": "actions/cache/restore@v5",
         "with": {"path": str(restored), "key": "k-1"}},
        {"if": "steps.restore.outputs.cache-hit != 'true'", "shell": "bash",
         "run": f"mkdir -p {restored} && echo built >{restored}/product"},
        {"id": "save", "if": "steps.restore.outputs.cache-hit != 'true'",
         "uses": "actions/cache/save@v5", "with": {"path": str(restored), "key": "k-1"}},
        {"shell": "bash", "env": {"HIT": "${{ steps.restore.outputs.cache-hit }}"},
         "run": f'mkdir -p {data} && echo "$HIT" >{data}/hit'},
        {"if": "always()", "uses": "actions/upload-artifact@v6",
         "with": {"name": "results", "path": str(data)}},
    ]  # fmt: skip
    action = write_action(tmp_path, steps)
    work = tmp_path / "w"
    first = harness("--action", str(action), "--work", str(work))
    assert first.returncode == 0, first.stdout + first.stderr
    assert (work / "artifacts/results/data/hit").read_text() == "\n"
    (restored / "product").unlink()
    second = harness("--action", str(action), "--work", str(work))
    assert second.returncode == 0, second.stdout + second.stderr
    assert (restored / "product").read_text() == "built\n"
    assert (work / "artifacts/results/data/hit").read_text() == "true\n"
