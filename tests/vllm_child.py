"""A vLLM run in a child interpreter for the vLLM tests (a script, not a test).

``python vllm_child.py SPEC.json``: SPEC holds ``model`` (a checkpoint
directory), ``engine`` (keyword arguments for ``vllm.LLM``), ``batches`` (a
list of batches, each a list of prompts as token-id lists, generated one
``generate`` call after the other), ``max_tokens`` and ``out``. Greedy,
``ignore_eos``, no tokenizer. Writes to ``out`` one
``{"request", "prompt", "output"}`` object per request, then deletes the
engine (the plugin's capture is written by then: the test checks it).
The capture settings come from the environment, as a user would set them.
SPEC's ``scheduled`` (a path): where to write the token total of every step
the scheduler made (``SchedulerOutput.total_num_scheduled_tokens``, in
order), the engine steps the capture's ``step_passes`` must hold; only an
in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) schedules here.

Data-parallel ranks (vLLM's offline SPMD launch: one such child per rank,
``VLLM_DP_RANK`` etc. in the environment) must all keep their engines until
every rank is done, or a rank still generating loses its peers mid-collective:
SPEC's ``done`` (a path this child creates after generating) and ``wait_for``
(the paths of every rank's ``done``) hold the engine until then. Meanwhile an
engine with nothing left to do keeps running dummy batches for the others.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    from vllm import LLM, SamplingParams

    scheduled: list[int] = []
    if "scheduled" in spec:
        from vllm.v1.core.sched.scheduler import Scheduler

        schedule = Scheduler.schedule

        def schedule_and_log(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            output = schedule(self, *args, **kwargs)
            scheduled.append(int(output.total_num_scheduled_tokens))
            return output

        Scheduler.schedule = schedule_and_log
    engine = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0)
    engine.update(spec.get("engine", {}))
    llm = LLM(model=spec["model"], **engine)
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    results = []
    for batch in spec["batches"]:
        outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        for out in outputs:
            results.append({"request": out.request_id, "prompt": list(out.prompt_token_ids),
                            "output": list(out.outputs[0].token_ids)})
    with open(spec["out"], "w") as handle:
        json.dump(results, handle)
    if "scheduled" in spec:
        with open(spec["scheduled"], "w") as handle:
            json.dump(scheduled, handle)
    if "done" in spec:
        open(spec["done"], "w").close()
    deadline = time.monotonic() + 120
    while not all(os.path.exists(path) for path in spec.get("wait_for", ())):
        if time.monotonic() > deadline:
            raise SystemExit(f"vllm_child: the other ranks did not finish: {spec['wait_for']}")
        time.sleep(0.05)
    if spec.get("delete", True):
        # Deleting the engine is an orderly shutdown: the capture must be on disk after it.
        del llm
        gc.collect()
        print("ENGINE-DELETED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
