"""CoRe-ECG: the student/teacher pretraining model (paper, Sec. Method), on its masking (STDM,
masking.py), its teacher's view (FDA, fda.py) and its objectives (losses.py)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ConfigError
from coreecg.methods.base import PretrainMethod
from coreecg.methods.core_ecg.fda import FrequencyDynamicAugmentation
from coreecg.methods.core_ecg.losses import info_nce, masked_mse
from coreecg.methods.core_ecg.masking import exclude_padding, make_masks
from coreecg.methods.classes import register_method
from coreecg.model.decoders import LatentDecoder, Projection, TimeDecoder
from coreecg.model.embed import patchify
from coreecg.encoders.build import build_encoder
from coreecg.model.padding import fill, padding_mask, sure_patches


@register_method("core")        # declared in options.py: methods.core, structural keys, losses
class CoReECG(PretrainMethod):
    """Student encoder on STDM-visible tokens; Time Decoder -> masked MSE; Latent Decoder +
    Projection -> InfoNCE against an EMA teacher (encoder + projection) on the FDA view.

    Only the branches a configuration uses are built: methods.core.loss.alpha = 0 builds no Time
    Decoder, methods.core.loss.beta = 0 no Latent Decoder, projection, teacher or FDA (so data-parallel
    training has no unused parameters).
    """

    def __init__(self, config: Config):
        super().__init__(config)
        m, o = config.model, config.methods.core
        self.options = o
        leads = len(config.data.preprocess.leads)
        if o.masking.strategy == "stdm" and leads < m.n_leads and not 0 < o.masking.k < leads:
            # the config check saw model.n_leads; a reduced-lead corpus (data.preprocess.leads) has fewer
            raise ConfigError(f"methods.core.masking.k={o.masking.k} must satisfy 0 < k < {leads}, the leads of "
                              f"data.preprocess.leads {list(config.data.preprocess.leads)}: lower k, or set "
                              "methods.core.masking.strategy=temporal (one lead has no spatial axis to mask)")
        self.encoder = build_encoder(config)        # a grid encoder: the config check refused others
        self.time_decoder = self.latent_decoder = self.projection = None
        self.teacher_encoder = self.teacher_projection = self.fda = None
        # The decoders share the encoder's width, grid and MLP shape (the paper's ViT: encoders.coreecg)
        width, n, patch = self.encoder.dim, config.n_patches, config.patch_size
        mlp, dropout = getattr(config.encoder, "mlp_ratio", 4.0), getattr(config.encoder, "dropout", 0.0)
        if o.loss.alpha > 0:
            t = o.time_decoder
            self.time_decoder = TimeDecoder(width, t.dim, t.depth, t.heads, m.n_leads, n, patch, mlp, dropout,
                                            t.layout)
        if o.loss.beta > 0:
            d = o.latent_decoder
            if d.dim != width:
                # The teacher projection is an EMA of the student projection, so both heads
                # must read embeddings of the same width.
                raise ValueError(f"methods.core.latent_decoder.dim={d.dim} must equal the encoder's width {width} "
                                 f"(encoders.{m.arch}.embed_dim)")
            self.latent_decoder = LatentDecoder(width, d.dim, d.depth, d.heads, m.n_leads, n, mlp, dropout, d.layout)
            self.projection = Projection(width, o.projection.hidden_dim, o.projection.dim)
            self.teacher_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
            self.teacher_projection = copy.deepcopy(self.projection).requires_grad_(False)
            a = o.fda
            if a.enabled:
                pre = config.data.preprocess
                band = (pre.highpass_hz, pre.lowpass_hz) if a.init == "band" else None
                self.fda = FrequencyDynamicAugmentation(m.n_leads, m.input_samples, a.eps, a.init_std, a.learnable,
                                                        band=band, fs=pre.sampling_rate)

    # ------------------------------------------------------------------ teacher

    def student_teacher_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        if self.teacher_encoder is None:
            return []
        return [(self.encoder, self.teacher_encoder), (self.projection, self.teacher_projection)]

    def ema_schedule(self) -> tuple[float, float]:
        """theta_t <- m * theta_t + (1 - m) * theta_s for encoder and projection (paper Eqs. 4, 8);
        the momentum is logged also for the teacher-less ablations (their update is a no-op)."""
        return self.options.ema.momentum, self.options.ema.momentum_end

    @property
    def varying_visible(self) -> bool:
        """Bernoulli STDM in a compiled step (train.compile; coreecg.train.speed sets `compiled`):
        the visible count varies per sample and batch (the other masks fix it), so the encoder keeps
        one dynamic, aligned graph. Eager steps need neither the alignment padding nor the
        always-built mask (about 4-5 % of a tiny CPU step)."""
        m = self.options.masking
        return m.strategy == "stdm" and m.mode == "bernoulli" and getattr(self, "compiled", False)

    @property
    def can_reconstruct(self) -> bool:
        return self.time_decoder is not None

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T) with C = model.n_leads, T = model.input_samples; NaN on a short record's
        padding (docs/data_pipeline.md "Short records"): a padded patch is never visible, never in
        the reconstruction loss (it joins `dropped`), and left out of the teacher's pooled target.

        Returns a dict of scalars: loss, loss_rec (only with a Time Decoder), loss_con (only
        with the contrastive branch) and diagnostics (visible_frac, masked_frac, dropped_frac,
        fda_rel_perturbation, teacher_student_cos), all tensors (detached except `loss`), so
        that logging costs no host sync here. An ablation logs no term it does not train.
        """
        cfg = self.config
        B, C, _ = self.check_input(x)
        lead_idx = self.lead_idx(C, x.device)
        visible, masked, dropped = self._masks(B, C, generator, x.device)
        enc = self.encoder(x, lead_idx, visible, self.varying_visible)   # leaves padding out itself
        pad = padding_mask(x, cfg.patch_size)
        visible, masked, dropped = exclude_padding((visible, masked, dropped), pad)

        zero = x.new_zeros((), dtype=torch.float32)
        out = {"visible_frac": visible.float().mean(), "masked_frac": masked.float().mean(),
               "dropped_frac": dropped.float().mean()}
        loss = zero
        if self.time_decoder is not None:
            recon = self.time_decoder(enc, lead_idx)
            out["loss_rec"] = masked_mse(recon, patchify(fill(x), cfg.patch_size), masked)
            loss = loss + self.options.loss.alpha * out["loss_rec"]
        if self.latent_decoder is not None:
            h_s = self.projection(self.latent_decoder(enc, lead_idx))
            h_t, rel = self._teacher(x, generator)
            out["loss_con"] = info_nce(h_s, h_t, self.options.loss.tau, gather=cfg.optim.gather_negatives)
            out["fda_rel_perturbation"] = rel
            out["teacher_student_cos"] = F.cosine_similarity(h_s.detach().float(), h_t.detach().float(), dim=-1).mean()
            loss = loss + self.options.loss.beta * out["loss_con"]
        out["loss"] = loss
        for key, value in out.items():
            if key != "loss":
                out[key] = value.detach()
        return out

    @torch.no_grad()
    def reconstruct(self, x: torch.Tensor, generator: torch.Generator | None = None,
                    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The Time Decoder's output under fresh masks, or under given `masks` (another model's,
        so two methods can be compared on the same patches), for figures; in eval mode.

        x: (B, C, T); masks: (visible, masked, dropped), each (B, C, N) bool -> reconstruction
        (B, C, N, P) and the (visible, masked, dropped) masks used.
        """
        if self.time_decoder is None:
            raise ValueError("this model has no Time Decoder (methods.core.loss.alpha = 0): nothing to reconstruct")
        B, C, _ = x.shape
        lead_idx = self.lead_idx(C, x.device)
        visible, masked, dropped = masks if masks is not None else self._masks(B, C, generator, x.device)
        recon = self.time_decoder(self.encoder(x, lead_idx, visible, self.varying_visible), lead_idx)
        return recon, *exclude_padding((visible, masked, dropped), padding_mask(x, self.config.patch_size))

    def _masks(self, B: int, C: int, generator: torch.Generator | None, device: torch.device):
        """(visible, masked, dropped), each (B, C, N) bool, drawn on the generator's device (else
        on `device`). The training loop's generator lives on the host, so on a GPU the masks
        and the encoder's padding plan are built there and copied over without a device sync."""
        where = generator.device if generator is not None else device
        return make_masks(self.options.masking, B, C, self.config.n_patches, generator=generator, device=where,
                          n_sure=sure_patches(self.config))

    def _teacher(self, x: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher projection of the FDA view, (B, proj_dim), and ||X_aug - X|| / ||X||.

        Autograd stays on when W learns: the gradient reaches W through the teacher's
        activations (its weights have requires_grad=False, so they get none).
        Short records: the FDA runs on the window with its padding set to 0 (zeros add nothing to
        the spectrum, so the view of the real part depends on the real samples only), then the
        padding is put back (NaN) so the teacher pools over the real patches only.
        """
        learn_w = self.fda is not None and isinstance(self.fda.weight, nn.Parameter) and self.training
        x0 = fill(x)
        lead_idx = self.lead_idx(x.shape[1], x.device)
        with torch.set_grad_enabled(learn_w and torch.is_grad_enabled()):
            # W's rows are the model's leads: indexed only for another lead set or order
            w_rows = None if self.all_leads_in_order and x.shape[1] == self.config.model.n_leads else lead_idx
            view = self.fda(x0, generator, w_rows) if self.fda is not None else x0
            view = torch.where(torch.isnan(x), x, view)        # the padding back (NaN), gradient 0 there
            h_t = self.teacher_projection(self.teacher_encoder.pooled(view, lead_idx))
        rel = ((fill(view.detach()).float() - x0.float()).norm() / x0.float().norm().clamp_min(1e-12))
        return h_t, rel
