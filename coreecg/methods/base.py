"""The contract every pretraining method meets, so that the one loop (`coreecg.train.loop`), the
in-loop probe, `encoder.pt`, Tune trials and fine-tuning run it unchanged."""
from __future__ import annotations

import torch
from torch import nn

from coreecg.config import STANDARD_LEADS, Config
from coreecg.model.encoder import default_lead_idx


class PretrainMethod(nn.Module):
    """A self-supervised method around the one `Encoder`.

    A subclass builds `self.encoder = build_encoder(config)` (coreecg.encoders: the encoder
    `model.arch` names, the network every downstream use loads from `encoder.pt`; its width is
    `self.encoder.dim`) plus whatever heads and targets it needs, and
    implements `forward`. Optional hooks:

    - momentum targets: return the student/target module pairs from `student_teacher_pairs`
      and the (start, end) momentum from `ema_schedule`; the step then updates the targets by
      EMA after every optimiser step (cosine schedule from start to end over the run).
    - `needs_patient_ids = True`: `forward` receives `patient` (B,) int64, equal for windows of
      the same patient (the loop looks it up from the corpus, where a recording without a patient
      id is its own patient; in-memory data: one per window).
    - `reconstruct(x, generator)`: draws the reconstruction figure at eval epochs.
    - `reported_losses`: the loss terms `forward` returns besides `loss`, each named
      "loss_<label>" (the console shows "<label> value"): the epoch's console line, the run's
      summary, the leaderboard and the sweep objectives read them (a term an ablation leaves out
      of its dict is simply not shown).
    """

    needs_patient_ids: bool = False
    reported_losses: tuple[str, ...] = ()
    # Targets run in eval mode (no dropout). MoCo v3 keeps its key encoder in train mode so that
    # the BatchNorm in its projector normalises with batch statistics, as the query's does.
    targets_in_eval_mode: bool = True

    def __init__(self, config: Config):
        super().__init__()
        self.config = config.validate()
        # The corpus's leads (data.preprocess.leads) as standard positions, made once and moved
        # with the module: no host-to-device copy per step. Empty: names that are not standard.
        leads, n = self.config.data.preprocess.leads, self.config.model.n_leads
        positions = [STANDARD_LEADS.index(x) for x in leads] if all(x in STANDARD_LEADS for x in leads) else []
        positions = positions if positions and max(positions) < n else []
        self.register_buffer("lead_positions", torch.tensor(positions, dtype=torch.long), persistent=False)
        self.all_leads_in_order = positions == list(range(n))     # the model's every lead, standard order

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T) the training crop (C = model.n_leads, T = model.input_samples).

        -> {"loss": scalar with grad, plus detached scalar diagnostics}. Draw every random
        choice from `generator` (seeded per step by the loop): runs are then reproducible.
        """
        raise NotImplementedError

    def check_input(self, x: torch.Tensor) -> tuple[int, int, int]:
        """(B, C, T) of a pretraining batch; ValueError unless T is the model's samples and C its
        leads (model.n_leads) or the corpus's (data.preprocess.leads, a subset of them)."""
        B, C, T = x.shape
        m = self.config.model
        if T != m.input_samples or C not in (m.n_leads, len(self.config.data.preprocess.leads)) or C > m.n_leads:
            raise ValueError(f"pretraining input must be (B, {m.n_leads}, {m.input_samples}) or (B, "
                             f"{len(self.config.data.preprocess.leads)}, {m.input_samples}) for data.preprocess.leads, "
                             f"got {tuple(x.shape)}")
        return B, C, T

    def lead_idx(self, C: int, device: torch.device) -> torch.Tensor:
        """(C,) the lead embedding of each input row: the standard positions of the corpus's leads
        (data.preprocess.leads: a Holter corpus of lead II trains lead II's embedding, which
        fine-tuning on lead II then reads), else the first C standard leads."""
        if self.lead_positions.numel() == C:
            return self.lead_positions
        return default_lead_idx(C, device, self.config.model.n_leads)

    # ------------------------------------------------------------------ momentum targets

    def student_teacher_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return []

    def ema_schedule(self) -> tuple[float, float] | None:
        return None

    @torch.no_grad()
    def update_teacher(self, momentum: float) -> None:
        """theta_t <- m * theta_t + (1 - m) * theta_s for every pair; buffers are copied."""
        for student, teacher in self.student_teacher_pairs():
            t_params = list(teacher.parameters())
            s_params = [p.detach() for p in student.parameters()]
            torch._foreach_lerp_(t_params, s_params, 1.0 - momentum)
            for tb, sb in zip(teacher.buffers(), student.buffers()):
                tb.copy_(sb)

    def train(self, mode: bool = True) -> "PretrainMethod":
        super().train(mode)
        if self.targets_in_eval_mode:
            for _, teacher in self.student_teacher_pairs():
                teacher.eval()
        return self

    # ------------------------------------------------------------------ figures

    @property
    def can_reconstruct(self) -> bool:
        return False

    def reconstruct(self, x: torch.Tensor, generator: torch.Generator | None = None):
        raise ValueError(f"{type(self).__name__} has no reconstruction to draw")
