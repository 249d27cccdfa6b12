"""Bad input: a clear message naming the problem, exit status 2, and nothing written or overwritten."""
import pytest
from PIL import Image

from gradcache.cli import main


def _snapshot(folder):
    """Every file of the run; not its lock file, which each job that tries the folder takes while it checks."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def _fails(argv, capsys, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_missing_data_path(tmp_path, tiny_args, capsys):
    _fails(tiny_args("simclr", tmp_path / "out", "--data", str(tmp_path / "nowhere")), capsys,
           "nowhere", "does not exist")
    _fails(tiny_args("clip", tmp_path / "out", "--data", str(tmp_path / "pairs.csv")), capsys, "pairs.csv")
    assert not (tmp_path / "out").exists()


def test_unreadable_data(tmp_path, tiny_args, capsys):
    (tmp_path / "folder" / "class").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (tmp_path / "folder" / "class" / f"{name}.png").write_bytes(b"\x89PNG broken")
    with pytest.warns(UserWarning, match=r"\w.png"):  # the held-out images are decoded at start
        _fails(tiny_args("simclr", tmp_path / "out", "--data", str(tmp_path / "folder"), "--test-size", "2"), capsys,
               "none of the 2 held-out images decoded")
    assert not (tmp_path / "out").exists()


def test_csv_without_the_named_columns(tmp_path, tiny_args, capsys):
    (tmp_path / "pairs.csv").write_text("image,text\na.png,a caption\n")
    _fails(tiny_args("clip", tmp_path / "out", "--data", str(tmp_path / "pairs.csv")), capsys,
           "no column 'filepath'", "--csv-image-key")


def test_undecodable_images_are_skipped_and_counted(tmp_path, tiny_args, capsys):
    import json

    rows = []
    for index in range(40):
        Image.new("RGB", (12, 12), (index * 6, 0, 255 - index * 6)).save(tmp_path / f"{index}.png")
        rows.append(f"{index}.png,picture number {index}")
    (tmp_path / "bad.png").write_bytes(b"nope")
    rows.append("bad.png,a broken picture")
    (tmp_path / "pairs.csv").write_text("filepath,title\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match="skipped 1 of 8 held-out images.*bad.png"):  # held out by data seed 0
        status = main(tiny_args("clip", tmp_path / "out", "--data", str(tmp_path / "pairs.csv"), "--test-size",
                                "8", "--batch-size", "8"))
    assert status == 0
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["skipped_images"] == 1


def test_batch_not_divisible_for_naive_accumulation(tmp_path, tiny_args, capsys):
    _fails(tiny_args("simclr", tmp_path / "out", "--strategy", "naive", "--chunk-size", "6"), capsys,
           "--strategy naive", "--chunk-size 6", "--chunk-size 4")
    assert not (tmp_path / "out").exists()


def test_chunk_larger_than_the_batch_is_one_chunk(tmp_path, tiny_args):
    assert main(tiny_args("simclr", tmp_path / "out", "--chunk-size", "1000", "--steps", "1")) == 0


@pytest.mark.parametrize("argv, fragment", [
    (["--batch-size", "1"], "--batch-size 1"),
    (["--batch-size", "500"], "exceeds the 64 training images"),
    (["--tile-size", "0"], "--tile-size"),
    (["--lr", "0"], "--lr"),
    (["--device", "cuda:7"], "CUDA is not available") if not __import__("torch").cuda.is_available() else
    (["--steps", "0"], "--steps"),
])
def test_bad_numbers(tmp_path, tiny_args, capsys, argv, fragment):
    _fails(tiny_args("simclr", tmp_path / "out", *argv), capsys, fragment)
    assert not (tmp_path / "out").exists()


def test_argparse_errors_exit_2(capsys):
    assert main(["train", "simclr", "--strategy", "magic"]) == 2
    assert main(["train", "simclr", "--steps", "3", "--epochs", "1"]) == 2
    assert main(["nonsense"]) == 2


@pytest.mark.parametrize(("argv", "usage", "suggested"), [
    (["train", "simclr", "--chunk_size", "8"], "usage: gradcache train simclr", "--chunk-size"),
    (["train", "--batchsize=64"], "usage: gradcache train simclr", "--batch-size"),
    (["train", "text", "--querykey", "q"], "usage: gradcache train text", "--query-key"),
    (["eval", "runs/x", "--batchsize", "8"], "usage: gradcache eval", "--batch-size"),
])
def test_a_misspelt_option_gets_its_commands_usage_and_a_suggestion(capsys, argv, usage, suggested):
    assert main(argv) == 2
    err = capsys.readouterr().err
    typo = next(token for token in argv if token.startswith("--")).split("=")[0]
    assert usage in err and f"unrecognized arguments: {typo}" in err and f"did you mean {suggested}?" in err


def test_an_unrecognized_argument_unlike_any_option_gets_no_suggestion(capsys):
    assert main(["train", "simclr", "--frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "usage: gradcache train simclr" in err and "--frobnicate" in err and "did you mean" not in err


def test_resume_from_a_different_model_overwrites_nothing(tmp_path, tiny_args, capsys):
    assert main(tiny_args("simclr", tmp_path / "run")) == 0
    before = _snapshot(tmp_path / "run")
    _fails(["train", "simclr", "--resume", str(tmp_path / "run"), "--width", "16"], capsys,
           "different model", "--width 8")
    _fails(["train", "clip", "--resume", str(tmp_path / "run")], capsys, "simclr checkpoint")
    _fails(["train", "simclr", "--resume", str(tmp_path / "elsewhere")], capsys, "does not exist")
    _fails(tiny_args("simclr", tmp_path / "run"), capsys, "already holds a run", "--resume")
    assert _snapshot(tmp_path / "run") == before


def test_help_states_every_default(capsys):
    assert main(["train", "simclr", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--strategy", "--batch-size", "--chunk-size", "--tile-size", "--optimizer", "--lr-scaling",
                   "--warmup", "--precision", "--seed", "--resume"):
        assert option in text
    assert text.count("(default:") >= 30


@pytest.mark.parametrize("mode", ["simclr", "clip"])
def test_help_states_each_default_once(capsys, mode):
    assert main(["train", mode, "--help"]) == 0
    text = capsys.readouterr().out.split("options:", 1)[1]
    blocks = ("\n" + text).split("\n  -")[1:]  # one per option: its flags and its help
    assert len(blocks) >= 40
    for block in blocks:
        assert " ".join(block.split()).count("(default") <= 1, block
    flat = " ".join(text.split())
    assert "(default: None)" not in flat and ("(default: 6 when --steps is not given)" in flat or mode == "clip")


def test_image_size_below_what_the_built_in_shapes_draw(tmp_path, tiny_args, capsys):
    # vit_tiny's patches take 4 pixels; the shapes are not drawn below 8 (convnet refuses 4 on its own first)
    _fails(tiny_args("simclr", tmp_path / "out", "--model", "vit_tiny", "--image-size", "4"), capsys,
           "--image-size 4", "built-in shapes", "--image-size 8")
    assert not (tmp_path / "out").exists()


def test_a_model_that_does_not_build_names_the_options_given_not_every_model_option(tmp_path, capsys):
    err = _fails(["train", "clip", "--text-heads", "3", "--output-dir", str(tmp_path / "out")], capsys,
                 "--text-heads 3", "not divisible by heads=3")
    assert "--norm" not in err and "--context-length" not in err
