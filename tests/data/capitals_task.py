"""An example task of your own (docs/tasks.md, "Your own task in Python"): name the capital.

Use it with `name = "capitals_task:CapitalsTask"` in [task] (this file's folder on sys.path,
e.g. the directory you start the node from) and `options = { countries = 4 }`.
"""
import dataclasses
import random

from ftis_edge.tasks import Prompt, Task, TaskError

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima",
            "Canada": "Ottawa", "Egypt": "Cairo", "Norway": "Oslo", "Chile": "Santiago"}


class CapitalsTask(Task):
    name = "capitals"                    # also the relay tag: peers with this task share rollouts

    def __init__(self, countries: int = len(CAPITALS), **options):
        super().__init__(**options)
        # graded by exact text, any case ("math" = math-verify, "regex" = the reference is a pattern)
        self.reward_settings = dataclasses.replace(self.reward_settings, rule="exact", ignore_case=True)
        self.countries = sorted(CAPITALS)[:countries]

    def get(self, prompt_id):            # "capitals/<country>": the id alone rebuilds the prompt
        country = prompt_id.removeprefix("capitals/") if isinstance(prompt_id, str) else None
        if country not in CAPITALS:
            raise TaskError(f"capitals: bad prompt id {prompt_id!r}")
        return Prompt(prompt_id, f"What is the capital of {country}?", CAPITALS[country])

    def prompts(self, seed=0, start=0):  # a pure function of (seed, position)
        i = start
        while True:
            yield self.get("capitals/" + random.Random(f"{seed}:{i}").choice(self.countries))
            i += 1

    def eval_prompts(self, limit=None):  # held out: countries training never draws
        held = [self.get("capitals/" + c) for c in sorted(CAPITALS) if c not in self.countries]
        return held[:limit]
