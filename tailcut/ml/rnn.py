"""A small Elman recurrent network (tanh) over token sequences, trained by BPTT, numpy only.

Per step t: ``h_t = tanh(E[x_t] + h_{t-1} W + b)`` and ``logits_t = h_t V + c``, a
softmax over the output vocabulary at every position; positions labelled -1 are
ignored. The gradient is back-propagated through all time steps (full BPTT; the
sequences are short). Layout, in forward order, for vocabulary ``N``, hidden size
``H`` and ``K`` output classes::

    embed.weight  (N, H)   input token -> hidden (one row per word)
    rec.weight    (H, H)   hidden -> hidden
    rec.bias      (H,)
    out.weight    (H, K)
    out.bias      (K,)

Every method computes in the dtype of ``params`` (float32 in training; a gradient
check may pass float64).
"""

from __future__ import annotations

import numpy as np

from tailcut.ml.models import Layer, check_params, layout, views

_EVAL_BATCH = 2048


class RNN:
    """Embedding -> tanh recurrence -> per-step softmax, cross-entropy over labelled steps."""

    name = "rnn"

    def __init__(self, vocab: int, num_classes: int, hidden: int = 64) -> None:
        self.vocab = vocab
        self.num_classes = num_classes
        self.hidden = hidden
        self.layers: tuple[Layer, ...] = layout(
            [
                ("embed.weight", (vocab, hidden)),
                ("rec.weight", (hidden, hidden)),
                ("rec.bias", (hidden,)),
                ("out.weight", (hidden, num_classes)),
                ("out.bias", (num_classes,)),
            ]
        )
        last = self.layers[-1]
        self.num_params = last.offset + last.size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Scaled Gaussian weights; a recurrence near 0.5 * orthogonal keeps BPTT stable."""
        params = np.zeros(self.num_params, dtype=np.float32)
        e, w, _, v, _ = views(self.layers, params)
        e[...] = rng.normal(0.0, 1.0, e.shape)
        q, _ = np.linalg.qr(rng.normal(size=w.shape))
        w[...] = 0.5 * q
        v[...] = rng.normal(0.0, np.sqrt(1.0 / self.hidden), v.shape)
        return params

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the labelled positions of the batch, and its gradient."""
        check_params(params, self.num_params)
        e, w, b, v, c = views(self.layers, params)
        hs = self._forward(params, x)  # (T+1, n, H), hs[0] = 0
        n, steps = x.shape
        logits = hs[1:] @ v + c  # (T, n, K)
        labels = y.T  # (T, n)
        valid = labels >= 0
        count = max(int(valid.sum()), 1)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        t_idx, n_idx = np.nonzero(valid)
        loss = float(-log_probs[t_idx, n_idx, labels[t_idx, n_idx]].sum()) / count
        dlogits = np.exp(log_probs)
        dlogits[t_idx, n_idx, labels[t_idx, n_idx]] -= 1
        dlogits *= valid[..., None]
        dlogits /= count

        grad = np.zeros_like(params)
        ge, gw, gb, gv, gc = views(self.layers, grad)
        gv[...] = np.einsum("tnh,tnk->hk", hs[1:], dlogits)
        gc[...] = dlogits.sum(axis=(0, 1))
        dh_next = np.zeros((n, self.hidden), dtype=params.dtype)
        for t in range(steps - 1, -1, -1):  # back through time
            dh = dlogits[t] @ v.T + dh_next
            dpre = dh * (1.0 - hs[t + 1] ** 2)
            gw += hs[t].T @ dpre
            gb += dpre.sum(axis=0)
            np.add.at(ge, x[:, t], dpre)
            dh_next = dpre @ w.T
        return loss, grad

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and per-token accuracy over the labelled positions."""
        check_params(params, self.num_params)
        _, _, _, v, c = views(self.layers, params)
        total_loss = 0.0
        correct = 0
        count = 0
        for lo in range(0, len(x), _EVAL_BATCH):
            xb, yb = x[lo : lo + _EVAL_BATCH], y[lo : lo + _EVAL_BATCH].T
            logits = self._forward(params, xb)[1:] @ v + c
            shifted = logits - logits.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            t_idx, n_idx = np.nonzero(yb >= 0)
            labels = yb[t_idx, n_idx]
            total_loss -= float(log_probs[t_idx, n_idx, labels].sum())
            correct += int(np.count_nonzero(logits[t_idx, n_idx].argmax(axis=-1) == labels))
            count += len(labels)
        count = max(count, 1)
        return total_loss / count, correct / count

    def _forward(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Hidden states (T+1, n, H), starting from zeros."""
        e, w, b, _, _ = views(self.layers, params)
        n, steps = x.shape
        hs = np.zeros((steps + 1, n, self.hidden), dtype=params.dtype)
        for t in range(steps):
            hs[t + 1] = np.tanh(e[x[:, t]] + hs[t] @ w + b)
        return hs
