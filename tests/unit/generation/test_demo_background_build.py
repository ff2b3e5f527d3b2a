"""`make demo` trains the stand-in generator in a background thread; when that build fails, the reason goes to
the run's log (stderr) instead of vanishing, and ernie_generated_images builds again in its own step."""

from dgx_assets.defs.generation.resources import ErnieServingResource
from dgx_assets.demo import _build_generator_in_background


def test_a_failed_background_build_writes_its_reason_to_stderr(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the generator's parent folder should be")
    ernie = ErnieServingResource(endpoints="local", model_dir=str(blocker / "ernie_generator"))

    thread = _build_generator_in_background(ernie)
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()

    err = capsys.readouterr().err
    assert "The background generator build failed; ernie_generated_images builds again" in err
    assert "not-a-folder" in err  # the OS error names the path it could not use


def test_no_background_build_when_the_generator_is_not_local(tmp_path):
    ernie = ErnieServingResource(endpoints="http://127.0.0.1:9", model_dir=str(tmp_path / "ernie_generator"))
    assert _build_generator_in_background(ernie) is None
