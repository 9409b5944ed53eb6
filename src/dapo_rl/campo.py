"""CAMPO's staged length limits (MiroMind-M1, arXiv 2507.14683, section 3): RL runs in stages whose response-length
limit grows (their recipe: 16K, then 32K tokens), so the policy first learns to be right within a short budget and
is then given room; a stage ends after its step count, or earlier when its responses saturate the limit. The
repetition penalty that CAMPO adds is `reward.repetition_penalty` (`dapo_rl.reward.shaping`), applied to each
response's score before group normalisation.

`CampoSchedule` is the stage state of one run: the current stage's settings for the next step (`stage_config`), the
end test after each step (`observe`), and its checkpoint state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dapo_rl.config import CampoConfig, CampoStageConfig, Config


@dataclass
class CampoSchedule:
    """Where a run is in `algorithm.campo.stages`.

    Attributes:
        campo: the stages and the saturation test's settings.
        stage: index of the current stage (0-based).
        stage_start: the last step before the current stage began (0 for the first stage).
        recent: `(truncated share, mean response length)` of the current stage's steps, the last
            `saturation_window` of them.
    """

    campo: CampoConfig
    stage: int = 0
    stage_start: int = 0
    recent: list[tuple[float, float]] = field(default_factory=list)

    @property
    def current(self) -> CampoStageConfig:
        return self.campo.stages[self.stage]

    def stage_config(self, cfg: Config) -> Config:
        """`cfg` with the current stage's `data.max_response_length` and clip bounds (the others unchanged)."""
        st = self.current
        algo = replace(
            cfg.algorithm,
            clip_ratio_low=cfg.algorithm.clip_ratio_low if st.clip_ratio_low is None else st.clip_ratio_low,
            clip_ratio_high=cfg.algorithm.clip_ratio_high
            if st.clip_ratio_high is None
            else st.clip_ratio_high,
        )
        return replace(
            cfg, data=replace(cfg.data, max_response_length=st.max_response_length), algorithm=algo
        )

    def metrics(self) -> dict[str, float]:
        """`campo/stage` (1-based), `campo/max_response_length` of the step just taken."""
        return {"campo/stage": self.stage + 1, "campo/max_response_length": self.current.max_response_length}

    def observe(self, step: int, clip_ratio: float, length_mean: float) -> str | None:
        """Record a finished step of the current stage; move to the next stage when this one has ended.

        The stage ends after `steps` steps in it, or (with `end_on_saturation`) when over its last
        `saturation_window` steps the mean truncated share is >= `saturation_clip_ratio` and the mean response
        length >= `saturation_length_ratio` x the stage's `max_response_length`. The last stage never ends.

        Args:
            step: the step just taken (1-based, the run's count).
            clip_ratio: its `train/response_clip_ratio`.
            length_mean: its mean response length in the context (tokens): `train/response_length_mean`, or with a
                tool `tool/context_length_mean` (the model's and the tool's tokens, which the limit bounds).

        Returns:
            A one-line note of the transition, or None.
        """
        c, st = self.campo, self.current
        self.recent = (self.recent + [(clip_ratio, length_mean)])[-c.saturation_window :]
        if self.stage == len(c.stages) - 1:
            return None
        ran = step - self.stage_start
        reason = None
        if st.steps > 0 and ran >= st.steps:
            reason = f"after its {st.steps} steps"
        elif st.end_on_saturation and len(self.recent) >= c.saturation_window:
            clip = sum(x for x, _ in self.recent) / len(self.recent)
            length = sum(y for _, y in self.recent) / len(self.recent)
            if (
                clip >= c.saturation_clip_ratio
                and length >= c.saturation_length_ratio * st.max_response_length
            ):
                reason = (
                    f"saturated: over the last {c.saturation_window} steps {clip:.1%} truncated, mean length "
                    f"{length:.1f} of {st.max_response_length}"
                )
        if reason is None:
            return None
        self.stage += 1
        self.stage_start = step
        self.recent = []
        nxt = self.current
        return (
            f"campo: stage {self.stage} ended at step {step} ({reason}); stage {self.stage + 1}: "
            f"max_response_length {nxt.max_response_length}"
        )

    def state_dict(self) -> dict:
        return {
            "stage": self.stage,
            "stage_start": self.stage_start,
            "recent": [list(x) for x in self.recent],
        }

    def load_state_dict(self, state: dict) -> None:
        self.stage = int(state.get("stage", 0))
        self.stage_start = int(state.get("stage_start", 0))
        self.recent = [(float(a), float(b)) for a, b in state.get("recent", [])]
        if not 0 <= self.stage < len(self.campo.stages):
            raise ValueError(
                f"the checkpoint is in CAMPO stage {self.stage + 1} but algorithm.campo.stages has "
                f"{len(self.campo.stages)}"
            )
