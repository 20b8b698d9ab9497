"""log p(target | hidden) through the LM head without a vocabulary-wide autograd graph.

Each row's output is one number, so its gradient with respect to the row's hidden state is one
vector: J_r = W^T (onehot(t_r) - softmax(z_r)) (times the softcap's derivative). When the head's
weight is frozen (LoRA), the forward computes it right away, from the logits it already holds, and
keeps only that [rows, hidden] vector; the backward is one multiply by the incoming gradient. No
[rows, vocab] tensor outlives the forward and the head's matmul runs twice, not three times (the
old checkpointed chunk ran it once without grad, again in the backward, then its transpose).
When the weight (or a bias) is trained (full fine-tuning), the weight gradient needs each row's
upstream gradient, so the forward keeps only the log-sum-exp and the backward recomputes the logits
once. Both compute in float32 whatever the inputs' dtype.
"""
from __future__ import annotations

import torch


def _logits(h, w, bias, softcap):
    """(logits z, tanh(z_raw / softcap) or None) in float32."""
    z = torch.addmm(bias.float(), h, w.t()) if bias is not None else h @ w.t()
    if not softcap:
        return z, None
    th = torch.tanh(z / softcap)
    return th * softcap, th


def _to_jacobian_(e, scale, targets, th):
    """e [rows, vocab] = exp(z - m) -> d logp / d z_raw = onehot(t) - e * scale (scale = 1 / Σ e), in
    place; times 1 - th² under a softcap."""
    e.mul_(-scale[:, None])
    e.scatter_add_(1, targets[:, None], torch.ones_like(scale)[:, None])
    if th is not None:
        e.mul_(1 - th * th)
    return e


class HeadLogprob(torch.autograd.Function):
    """(log p(t | h) [rows], entropy [rows] or None): see the module docstring."""

    @staticmethod
    def forward(ctx, h, w, bias, targets, softcap, entropy: bool):
        dev = h.device.type
        with torch.autocast(dev, enabled=False):
            hf, wf = h.float(), w.float()
            z, th = _logits(hf, wf, bias, softcap)
            picked = z.gather(1, targets[:, None]).squeeze(1)
            ent = None
            if entropy:      # -Σ p log p = lse - Σ p z, before z is overwritten
                lse = torch.logsumexp(z, dim=-1)
                ent = lse - torch.linalg.vecdot((z - lse[:, None]).exp_(), z)
            top = z.amax(dim=-1)
            e = z.sub_(top[:, None]).exp_()                 # in place: no second [rows, vocab] tensor
            total = e.sum(dim=-1)
            lse = top + total.log()
            logp = picked - lse
            train_head = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
            ctx.eager = ctx.needs_input_grad[0] and not train_head
            ctx.softcap, ctx.h_dtype = softcap, h.dtype
            if ctx.eager:        # the frozen head: each row's gradient vector now, nothing [rows, vocab] kept
                ctx.save_for_backward(_to_jacobian_(e, 1 / total, targets, th) @ wf)
            elif any(ctx.needs_input_grad[:3]):
                ctx.save_for_backward(h, w, bias, targets, lse)
            del e
        del z, th
        if ent is None:
            return logp
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad, *_):
        dev = grad.device.type
        with torch.autocast(dev, enabled=False):
            if ctx.eager:
                (jac,) = ctx.saved_tensors
                return (grad.float()[:, None] * jac).to(ctx.h_dtype), None, None, None, None, None
            h, w, bias, targets, lse = ctx.saved_tensors
            hf, wf = h.float(), w.float()
            z, th = _logits(hf, wf, bias, ctx.softcap)
            e = z.sub_(lse[:, None]).exp_()
            gz = _to_jacobian_(e, torch.ones_like(lse), targets, th).mul_(grad.float()[:, None])
            grad_h = (gz @ wf).to(h.dtype) if ctx.needs_input_grad[0] else None
            grad_w = (gz.t() @ hf).to(w.dtype) if ctx.needs_input_grad[1] else None
            grad_b = gz.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None, None


def head_logprob(h, w, bias, targets, softcap=None, entropy: bool = False):
    """log p(targets | h) under the head (w, bias), and with ``entropy`` also each row's entropy (detached)."""
    out = HeadLogprob.apply(h, w, bias, targets, softcap, entropy)
    return out
