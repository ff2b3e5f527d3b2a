"""The generation Spark job in one call, as the tests drive it (the asset splits the steps to log and count)."""

from dgx_assets.generation.generate import GenerationJob, generated_frame, split_work


def build_generated_frame(prompts, job: GenerationJob, previous=None):
    """Split the work against `previous`, generate what is needed, keep the rest: the table's lazy DataFrame."""
    todo, kept = split_work(prompts, previous)
    return generated_frame(todo, kept, job)
