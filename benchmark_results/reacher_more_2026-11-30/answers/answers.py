"""Diagnostic: every fully evaluated candidate of a run (finals + verified pool), train mean vs held-out mean."""

import asyncio
import sys
import tempfile
from pathlib import Path
from agents.evolve_config import EvolveConfig
from agents.se_darwin_agent import SEDarwinAgent
from genesis_fp16.base.settings import load_settings


def main():
    env, steps, seeds = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    for seed in seeds:
        state = Path(tempfile.mkdtemp())
        cfg = EvolveConfig(
            seed=seed, budget=100000, budget_steps=steps, env_id=env, target=None, policy=None, episode_steps=None
        )
        agent = SEDarwinAgent(cfg, settings=load_settings(state_dir=state))
        rows = []
        orig = agent._answer

        async def answer():
            finals = []
            ob = agent._outside_budget

            async def spy(phase, params, states):
                res = await ob(phase, params, states)
                finals.append((params, res.mean_return))
                return res

            agent._outside_budget = spy
            best = await orig()
            agent._outside_budget = ob
            import math

            scored = [c for c in agent.pool if c.full and c.real_return is not None and math.isfinite(c.real_return)]
            # the finals are not in pool: re-run orig's list by capturing through _outside_budget is simpler: recompute
            cands = {c.id: c for c in scored}
            cands[best.id] = best

            class F:
                pass

            for k, (p, m) in enumerate(finals):
                f = F()
                f.id = f"final{k}"
                f.params = p
                f.real_return = m
                cands[f.id] = f
            for c in sorted(cands.values(), key=lambda c: -c.real_return)[:14]:
                h = await agent._outside_budget("heldout", c.params, agent.starts.heldout)
                v = await agent._outside_budget("heldout", c.params, agent.starts.validation)
                rows.append((c.id, c.real_return, v.mean_return, h.mean_return, c.id == best.id))
            return best

        agent._answer = answer
        report = asyncio.run(agent.evolve())
        print(f"seed {seed}: report heldout {report['heldout_return']:.2f} answer {report['best_candidate']['id']}")
        for r in rows:
            print(
                f"   {r[0]:32s} train {r[1]:8.2f} valid {r[2]:8.2f} heldout {r[3]:8.2f} {'<- answer' if r[4] else ''}"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
