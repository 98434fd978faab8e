"""Developer sessions (`pip install nox`): the quick check on every supported Python, the full suite per torch release.

    nox -s quick          # python -m pytest (the quick check) on Python 3.11, 3.12 and 3.13, newest torch in range
    nox -s full           # python -m pytest --full (what CI runs) on Python 3.11, with each release of TORCH_RELEASES
    nox -s full-3.11(torch='2.15.0')   # one of them

Each session builds its own virtualenv under .nox/ (torch with it: a few GB per session); `-r` reuses it. Each Python
must be on PATH as python3.11, python3.12, python3.13 (with pyenv: `pyenv shell 3.11.7 3.12.1 3.13.0`).
"""

import nox

PYTHONS = ["3.11", "3.12", "3.13"]
# The oldest release the suite is run with (README's and CI's CPU build) and the newest the package accepts.
TORCH_RELEASES = ["2.13.0", "2.15.0"]
# A pip constraint file in the machine's pip config (some set one to keep torch at a release on disk) would refuse the
# release a session asks for: the sessions install without one.
NO_CONSTRAINT = {"PIP_CONSTRAINT": "/dev/null"}


@nox.session(python=PYTHONS)
def quick(session: nox.Session) -> None:
    """The quick check: every module touched in a few minutes."""
    session.install("-e", ".[test]", env=NO_CONSTRAINT)
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session(python="3.11")
@nox.parametrize("torch", TORCH_RELEASES)
def full(session: nox.Session, torch: str) -> None:
    """The whole suite, as CI runs it, with one torch release."""
    session.install(f"torch=={torch}", env=NO_CONSTRAINT)
    session.install("-e", ".[test]", env=NO_CONSTRAINT)
    # tests/test_docs.py checks the README's torch==2.13.0 against this release instead
    session.run("python", "-m", "pytest", "-q", "--full", *session.posargs, env={"APPO_TORCH_UNDER_TEST": torch})
