from __future__ import annotations

from utils.paths import file_in_the_way


def test_a_folder_is_in_the_way_only_of_a_file_at_or_above_it(tmp_path):
    assert file_in_the_way(tmp_path) is None  # a folder
    assert file_in_the_way(tmp_path / "new" / "deeper") is None  # can become one
    (tmp_path / "file").write_text("x")
    assert file_in_the_way(tmp_path / "file") == tmp_path / "file"
    assert file_in_the_way(tmp_path / "file" / "below") == tmp_path / "file"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert file_in_the_way(tmp_path / "dangling" / "runs") == tmp_path / "dangling"
    (tmp_path / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert file_in_the_way(tmp_path / "linked" / "runs") is None  # a link to a folder is a folder
