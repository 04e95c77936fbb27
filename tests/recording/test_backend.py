"""The backend in use is the one the run asked for."""

import turbospark
from conftest import EXPECTED_BACKEND, core_of


def test_the_expected_backend_is_in_use() -> None:
    # An install whose extension silently failed to build would otherwise
    # run the whole suite against the fallback and still pass.
    assert turbospark.BACKEND == EXPECTED_BACKEND


def test_the_recorder_is_built_on_the_chosen_core() -> None:
    core_module = core_of(turbospark.RouterHistogram).__module__
    assert core_module == ("turbospark.recording._recorder" if EXPECTED_BACKEND == "cython" else "turbospark.recording._recorder_py")
