"""Experiment trackers (`trainer.logger`, verl's key): each backend through its own library.

`dapo train` always writes `<output_dir>/metrics.jsonl` (its plot, `dapo ablate` and resume read it); the names in
`trainer.logger` choose what else receives each metrics row, under the same step axis (`step`, the RL step;
validation rows at that step carry `val/...` keys):

- `console`: one line per step on the terminal;
- `jsonl`: metrics.jsonl (always written; naming it is allowed);
- `tensorboard`: event files under `<output_dir>/tensorboard` (`torch.utils.tensorboard`; extra `tensorboard`);
- `wandb`: Weights & Biases, run files under `<output_dir>/wandb`; `WANDB_MODE=offline` logs without a network
  (extra `wandb`);
- `trackio`: Hugging Face Trackio's local database (`TRACKIO_DIR`, default `~/.cache/huggingface/trackio`; extra
  `trackio`);
- `mlflow`: MLflow at `MLFLOW_TRACKING_URI`, default a SQLite store `<output_dir>/mlflow.db` (`mlflow ui
  --backend-store-uri sqlite:///<output_dir>/mlflow.db`; extra `mlflow`).

The run is `trainer.project_name` / `trainer.experiment_name` (default: the output directory's name); the resolved
config goes to each backend (wandb and trackio config, MLflow params, TensorBoard text). A resumed run continues the
same wandb / MLflow / Trackio run (ids kept in `<output_dir>/tracking.json`), and TensorBoard drops the events
after the checkpoint's step, as metrics.jsonl does.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path

from dapo_rl.config import TRACKERS, ConfigError

_LIBRARY_BACKED = ("tensorboard", "wandb", "trackio", "mlflow")
"""Trackers that need their library: each name is also its module's and its `dapo-rl[...]` extra's."""


def check_trackers(names: list[str]) -> None:
    """Check `trainer.logger` before a run starts: known names, libraries importable.

    Raises:
        ConfigError: an unknown name (the valid ones listed) or a missing library (the pip line given).
    """
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"trainer.logger: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}")
        if name not in _LIBRARY_BACKED:
            continue
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(
                f"trainer.logger has {name!r} but the {name} package is not installed ({e}): "
                f"pip install 'dapo-rl[{name}]'"
            ) from e


def scalars(row: dict) -> dict[str, float]:
    """The numeric entries of a metrics row, `step` left out (bools as 0/1; strings and None dropped)."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts (alphanumerics, `_-. :/`): `@` -> `_at_`, anything else outside the set -> `_`
    (`val/aime/avg@32` -> `val/aime/avg_at_32`)."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (the config as MLflow parameters); lists become their JSON text."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= flatten(v, key + ".")
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else v
    return out


class Tracking:
    """The trackers of one run (rank 0 only): `log(row, step)` after each step, `finish()` at the end.

    Args:
        names: `trainer.logger`.
        project: `trainer.project_name`.
        experiment: `trainer.experiment_name`.
        config: the resolved config as nested dicts (`OmegaConf.to_container`).
        out_dir: the run directory (TensorBoard, wandb and MLflow files go under it; `tracking.json` holds run ids).
        resume_step: the checkpoint step a resumed run continues from (None: a fresh run).

    Raises:
        ConfigError: as `check_trackers`.
    """

    def __init__(
        self,
        names: list[str],
        project: str,
        experiment: str,
        config: dict,
        out_dir: Path,
        resume_step: int | None = None,
    ):
        check_trackers(names)
        self.names = list(dict.fromkeys(names))
        self.out = Path(out_dir)
        self.ids_path = self.out / "tracking.json"
        self.ids = (
            json.loads(self.ids_path.read_text())
            if resume_step is not None and self.ids_path.exists()
            else {}
        )
        self._tb = self._wandb = self._trackio = self._mlflow = None
        for name in self.names:
            if name in ("console", "jsonl"):
                continue
            try:
                self._start(name, project, experiment, config, resume_step)
            except Exception as e:
                self.finish()
                raise ConfigError(f"trainer.logger: {name} did not start: {type(e).__name__}: {e}") from e
        if self.ids:
            self.out.mkdir(parents=True, exist_ok=True)
            self.ids_path.write_text(json.dumps(self.ids, indent=1) + "\n")

    def _start(self, name: str, project: str, experiment: str, config: dict, resume_step: int | None) -> None:
        if name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events at or after it (written after the checkpoint) are dropped when they come again
            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(log_dir=str(self.out / "tensorboard"), purge_step=purge)
            if resume_step is None:
                from omegaconf import OmegaConf

                self._tb.add_text("config", "```yaml\n" + OmegaConf.to_yaml(config) + "```", 0)
        elif name == "wandb":
            import wandb

            run_id = self.ids.get("wandb")
            self._wandb = wandb.init(
                project=project,
                name=experiment,
                config=config,
                dir=str(self.out),
                id=run_id,
                resume="allow" if run_id else None,
            )
            self.ids["wandb"] = self._wandb.id
        elif name == "trackio":
            import trackio

            resume = "allow" if resume_step is not None else "never"
            self._trackio = trackio.init(project=project, name=experiment, config=config, resume=resume)
        elif name == "mlflow":
            import mlflow

            if not os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri(f"sqlite:///{(self.out / 'mlflow.db').resolve()}")
            mlflow.set_experiment(project)
            run_id = self.ids.get("mlflow")
            self._mlflow = mlflow.start_run(run_id=run_id, run_name=None if run_id else experiment)
            if not run_id:
                params = flatten(config)
                items = list(params.items())
                for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per call
                    mlflow.log_params(dict(items[i : i + 100]))
            self.ids["mlflow"] = self._mlflow.info.run_id

    def log(self, row: dict, step: int) -> None:
        """Send a metrics row's numbers at `step` (the RL step) to every backend but console and jsonl."""
        values = scalars(row)
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._trackio is not None:
            import trackio

            trackio.log(values, step=step)
        if self._mlflow is not None:
            import mlflow

            mlflow.log_metrics({mlflow_name(k): v for k, v in values.items()}, step=step)

    def finish(self) -> None:
        """Close every backend (files flushed, runs marked finished); safe to call twice."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._trackio is not None:
            import trackio

            trackio.finish()
            self._trackio = None
        if self._mlflow is not None:
            import mlflow

            mlflow.end_run()
            self._mlflow = None
