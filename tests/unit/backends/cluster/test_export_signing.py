"""The folder a savepoint asks workers to write into is signed like a spec, and only such a folder is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlet.backends.cluster.tree.signing import export_folder, sign_export
from streamlet.errors import SpecError

SECRET = b"s" * 32


def trigger(folder: str, secret: bytes = SECRET, job: str = "wc", epoch: int = 3) -> dict[str, object]:
    return {"epoch": epoch, "export": folder, "export_signature": sign_export(secret, job, epoch, folder)}


def test_a_signed_parts_folder_is_used(tmp_path: Path) -> None:
    """Signed for this job and epoch, absolute, '<file>.parts', no link: accepted as given."""
    folder = str(tmp_path / "sp.parts")
    assert export_folder(SECRET, "wc", 3, trigger(folder)) == Path(folder)


@pytest.mark.parametrize(("job", "epoch", "secret"), [("other", 3, SECRET), ("wc", 4, SECRET), ("wc", 3, b"x" * 32)])
def test_a_signature_for_another_job_epoch_or_secret_is_refused(
    tmp_path: Path, job: str, epoch: int, secret: bytes
) -> None:
    """The signature binds the folder to the job, the epoch and the cluster's secret."""
    folder = str(tmp_path / "sp.parts")
    with pytest.raises(SpecError, match=rf"^job '{job}': the savepoint folder .* of epoch {epoch} is not signed"):
        export_folder(SECRET, job, epoch, trigger(folder, secret=secret))


def test_a_folder_that_is_not_a_parts_folder_or_is_a_link_is_refused(tmp_path: Path) -> None:
    """Relative, another name, or a symbolic link to elsewhere: refused even when signed."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link.parts").symlink_to(tmp_path / "elsewhere")
    for folder in ["sp.parts", str(tmp_path / "etc"), str(tmp_path / "link.parts")]:
        with pytest.raises(SpecError, match=r"is not an absolute '<file>\.parts' folder without symbolic links"):
            export_folder(SECRET, "wc", 3, trigger(folder))
