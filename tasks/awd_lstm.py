"""AWD-LSTM (Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models", section 4): the language
model of the lstm_ptb task, with its dropouts, activation penalties and the hidden state carried across windows."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from birder_repro.tasks.common import pick_size

__all__ = ["SIZES", "LSTMSize", "Regularization", "AWDLSTM", "HiddenCarry", "Hidden", "lstm_lm"]


def _fp16_autocast_on_cpu(x: torch.Tensor) -> bool:
    """fp16 autocast on the CPU has no LSTM (oneDNN: "could not create a primitive descriptor for the LSTM
    forward propagation primitive"): there the LSTM layers run in fp32 (autocast off inside them), the rest of
    the model in fp16. bf16 on the CPU and every precision on a GPU (cuDNN) keep autocast's own choice."""
    return (
        x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    )


@dataclass(frozen=True)
class LSTMSize:
    embedding: int
    hidden: int
    layers: int


# model.size -> widths. full: AdaBelief's --emsize 400 --nhid 1150 --nlayer 3; tiny: the same code, CPU smoke runs.
SIZES = {
    "full": LSTMSize(embedding=400, hidden=1150, layers=3),
    "tiny": LSTMSize(embedding=16, hidden=32, layers=3),
}


@dataclass(frozen=True)
class Regularization:
    """AWD-LSTM's dropouts and activation penalties (Merity et al. 2018, section 4), from ``cfg.model``."""

    dropout: float = 0.4  # locked dropout on the last layer's output
    dropouth: float = 0.25  # locked dropout between LSTM layers
    dropouti: float = 0.4  # locked dropout on the embedded input
    dropoute: float = 0.1  # dropout of whole words from the embedding matrix
    wdrop: float = 0.5  # DropConnect on every layer's hidden-to-hidden weights
    alpha: float = 2.0  # activation regularization (AR) on the last layer's dropped output
    beta: float = 1.0  # temporal activation regularization (TAR) on its raw output

    @classmethod
    def from_cfg(cls, model_cfg) -> Regularization:
        return cls(**{name: float(model_cfg[name]) for name in cls.__dataclass_fields__})


# --------------------------------------------------------------------------------------------------------------
# Model


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout (Gal and Ghahramani 2016): one mask per sequence, shared by all time steps of (T, B, H)."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.shape[1], x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The embedding matrix with whole words (rows) dropped, as AWD-LSTM's ``embedded_dropout``."""
    if not training or p == 0:
        return weight
    return weight * (weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p))


Hidden = list[tuple[torch.Tensor, torch.Tensor]]


class HiddenCarry:
    """The hidden state handed from one training window to the next (truncated BPTT), kept on the model.

    A window starts from the state the previous window ended with; window 0 of an epoch (and a window after a
    gap, as on resuming mid-epoch) starts from zeros, as AWD-LSTM's ``init_hidden`` at every epoch. The same
    window seen again (the training loop's timing calibration runs forward + backward on one batch a few times)
    starts from the same state again, so those passes leave training as it would be without them.
    """

    def __init__(self):
        self.index: int | None = None
        self.start: Hidden | None = None
        self.end: Hidden | None = None

    def start_of(self, index: int, zeros) -> Hidden:
        if self.index is not None and index == self.index:
            return self.start
        if self.index is not None and index == self.index + 1:
            return self.end
        return zeros()

    def store(self, index: int, start: Hidden, end: Hidden) -> None:
        # Detached: back-propagation stops at the window's start.
        self.index, self.start = index, start
        self.end = [(h.detach(), c.detach()) for h, c in end]


class AWDLSTM(nn.Module):
    """Embedding, a stack of one-layer LSTMs, and a decoder tied to the embedding (AWD-LSTM's RNNModel).

    ``forward(tokens (T, B), hidden) -> (logits (T, B, V), new hidden, penalty)``: ``penalty`` is the AR + TAR
    term in training mode and 0 in evaluation mode; the model owns its coefficients as it owns its dropouts.
    """

    def __init__(self, vocab_size: int, size: LSTMSize, reg: Regularization):
        super().__init__()
        if size.layers < 1:
            raise ValueError(f"an LSTM needs at least one layer, got {size.layers}")
        self.size, self.reg = size, reg
        self.carry = HiddenCarry()  # training state, not a parameter or buffer: DDP neither syncs nor saves it
        self.encoder = nn.Embedding(vocab_size, size.embedding)
        self.rnns = nn.ModuleList(nn.LSTM(self._width(i - 1), self._width(i)) for i in range(size.layers))
        # The decoder's weight is the embedding matrix (tied), which is why the last layer is embedding-wide.
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)  # AWD-LSTM's init_weights (initrange 0.1)

    def _width(self, layer: int) -> int:
        """Input width of layer 0 (``layer=-1``), else the output width of ``layer``."""
        return self.size.embedding if layer in (-1, self.size.layers - 1) else self.size.hidden

    def init_hidden(self, batch: int, device: torch.device | None = None) -> Hidden:
        """Zero (h, c) for every layer: AWD-LSTM's ``init_hidden`` at the start of each epoch and evaluation."""
        device = device or self.encoder.weight.device

        def zeros(width: int) -> torch.Tensor:
            return torch.zeros(1, batch, width, device=device)

        return [(zeros(self._width(i)), zeros(self._width(i))) for i in range(self.size.layers)]

    def _run_layer(self, rnn: nn.LSTM, x: torch.Tensor, state) -> tuple[torch.Tensor, tuple]:
        """One LSTM layer, with DropConnect on its hidden-to-hidden weights while training (AWD-LSTM's WeightDrop).

        The dropped weight is passed in place of the parameter through ``torch.func.functional_call``, so the
        parameter itself stays a plain registered parameter (DDP reduces its gradient like any other).
        """
        fp32 = _fp16_autocast_on_cpu(x)
        if fp32:
            x, state = x.float(), tuple(s.float() for s in state)
        with torch.autocast("cpu", enabled=False) if fp32 else contextlib.nullcontext():
            if not (self.training and self.reg.wdrop > 0):
                return rnn(x, state)
            params = dict(rnn.named_parameters())
            params["weight_hh_l0"] = F.dropout(rnn.weight_hh_l0, p=self.reg.wdrop, training=True)
            return torch.func.functional_call(rnn, params, (x, state))

    def forward(self, tokens: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        reg, training = self.reg, self.training
        weight = embedding_dropout(self.encoder.weight, reg.dropoute, training)
        x = locked_dropout(F.embedding(tokens, weight), reg.dropouti, training)
        new_hidden = []
        for layer, rnn in enumerate(self.rnns):
            raw, state = self._run_layer(rnn, x, hidden[layer])
            new_hidden.append(state)
            last = layer == len(self.rnns) - 1
            x = locked_dropout(raw, reg.dropout if last else reg.dropouth, training)
        logits = F.linear(x, self.encoder.weight, self.decoder_bias)
        penalty = self._activation_penalty(raw, x) if training else logits.new_zeros(())
        return logits, new_hidden, penalty

    def _activation_penalty(self, raw: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
        """AR: alpha * mean(dropped output^2); TAR: beta * mean((h_t - h_{t-1})^2) (Merity et al. 2018, 4.6)."""
        penalty = self.reg.alpha * dropped.pow(2).mean()
        if raw.shape[0] > 1:  # TAR needs two time steps
            penalty = penalty + self.reg.beta * (raw[1:] - raw[:-1]).pow(2).mean()
        return penalty


def lstm_lm(vocab_size: int, size: str = "full", reg: Regularization = Regularization()) -> AWDLSTM:
    """The AWD-LSTM of AdaBelief's 3-layer PTB runs (``size="full"``) or its tiny CPU variant."""
    return AWDLSTM(vocab_size, pick_size(size, SIZES), reg)
