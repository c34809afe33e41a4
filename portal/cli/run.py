"""`devcloud run`'s parts that need no portal: the time limit's syntax, the launch's idempotency key, the
command line the instance runs, and the directory sent ahead of it."""

import hashlib
import io
import json
import re
import shlex
import tarfile
from pathlib import Path

# Where --sync puts the directory, and where the command then runs; without --sync it runs in /workspace.
SYNC_TARGET = "/workspace/src"
WORKSPACE = "/workspace"

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in "90", "90s", "30m", "2h" or "1d". Raises ValueError with a sentence for anything else."""
    match = _DURATION.match(text or "")
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a time limit; write it as 90s, 30m, 2h or 1d.")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def ci_run_key(environ, request: dict) -> str:
    """The idempotency key a CI provider's own run names, or "" outside CI.

    GitHub Actions: the repository, run id, attempt and job; GitLab CI: the project and job id (a retried
    GitLab job gets a new id). A step retried within the same attempt sends the same key, so it finds the
    instance the first try launched instead of launching another. A re-run of the workflow (a new attempt)
    launches anew. `request` (size, image, command, ...) is folded in, so two different `devcloud run`
    calls in one job do not share an instance; calls that are the same in all of these need --key.
    """
    if environ.get("GITHUB_RUN_ID"):
        names = [
            "github",
            environ.get("GITHUB_REPOSITORY", ""),
            environ["GITHUB_RUN_ID"],
            environ.get("GITHUB_RUN_ATTEMPT", "1"),
            environ.get("GITHUB_JOB", ""),
        ]
    elif environ.get("CI_JOB_ID"):
        names = ["gitlab", environ.get("CI_PROJECT_PATH", ""), environ["CI_JOB_ID"]]
    else:
        return ""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]
    return "run:" + ":".join(names) + ":" + digest


def command_line(command) -> str:
    """The command line for the instance's shell. One argument is a shell command line, as written
    (`-- 'cd /workspace && make'`); several are a program and its arguments, each kept whole
    (`-- python3 -c 'print(6 * 7)'`), where plain ssh would join them with spaces and let the remote
    shell split them again."""
    return command[0] if len(command) == 1 else shlex.join(command)


def remote_command(command, *, synced: bool) -> str:
    """What the instance runs for `devcloud run`: command_line(command) in the run's directory."""
    line = command_line(command)
    # The login shell waits for the command's shell instead of becoming it (the `exit` after it), so a
    # command killed by a signal ends with 128 + the signal, as in a local shell, rather than sshd
    # reporting the signal, which the OpenSSH client turns into 255.
    return f"cd {SYNC_TARGET if synced else WORKSPACE} && sh -c {shlex.quote(line)}; exit $?"


SYNC_COMMAND = f"rm -rf {SYNC_TARGET} && mkdir -p {SYNC_TARGET} && tar -xzf - -C {SYNC_TARGET}"


def sync_archive(directory: Path) -> bytes:
    """`directory` as a gzipped tar, without its .git, for SYNC_COMMAND to unpack in the instance.
    Raises ValueError when it is not a directory."""
    if not directory.is_dir():
        raise ValueError(f"--sync {directory}: not a directory.")
    buffer = io.BytesIO()

    def skip_git(member: tarfile.TarInfo):
        return None if ".git" in Path(member.name).parts else member

    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for child in sorted(directory.iterdir()):
            archive.add(child, arcname=child.name, filter=skip_git)
    return buffer.getvalue()
