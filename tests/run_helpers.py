"""Helpers shared by the tests of runs that stop and resume."""

from training import Run


def interrupt_at(monkeypatch, frames):
    """Make the run behave as if SIGINT arrived during the batch that reaches ``frames`` (then it saves
    ``resume.ckpt`` and stops); a resumed run (``run.resume`` set) is left alone."""
    original = Run.record_batch

    def record_batch(self, batch, metrics):
        if self.frames + batch.numel() >= frames and self.run.resume is None:
            self.signals.interrupted_by = "SIGINT"
        return original(self, batch, metrics)

    monkeypatch.setattr(Run, "record_batch", record_batch)
