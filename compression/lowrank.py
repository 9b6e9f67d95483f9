"""PowerSGD-style low-rank codec: rank-r factors from one warm-started power iteration.

The tensor is viewed as a matrix [shape[0], rest]. The encoder keeps its right factor Q between
calls (one codec instance per key), so the single power iteration per step keeps refining the same
subspace; with error feedback this converges to the best rank-r approximation over steps
(Vogels et al., 2019). The decoder needs only the payload: P @ Q.T.
"""

from __future__ import annotations

import math

import torch

from netsense.errors import CompressionError

from .base import (
    DTYPE_NAMES,
    Codec,
    Payload,
    bytes_to_tensor,
    check_payload_header,
    expect_bytes,
    register_codec,
    tensor_to_bytes,
)
from .limits import cast_clamped, checked_numel, require_finite, split_suffix
from .sparse import meta_int

DENSE = 0
"""Meta mode: the tensor travels dense in its own dtype (1-D, or too small for factors to pay)."""
FACTORS = 1
"""Meta mode: parts are P [rows, r] and Q [cols, r]."""
MAX_RANK = 256


def matrix_dims(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) of the matrix view, or None for tensors that are not matrices."""
    if len(shape) < 2 or shape[0] == 0:
        return None
    return shape[0], math.prod(shape[1:])


def factors_pay(rows: int, cols: int, rank: int) -> bool:
    """True when rank-`rank` factors are strictly smaller than the dense matrix."""
    return min(rows, cols) > rank and (rows + cols) * rank < rows * cols


def factor_dims(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
    """(rows, cols) of the matrix a tensor of `shape` travels as at rank `rank`, None where it
    travels dense (a vector, a matrix too small for factors to pay): the one rule the encoder,
    the decoder and the wire-size planning share."""
    dims = matrix_dims(shape)
    return dims if dims is not None and factors_pay(*dims, rank) else None


def wire_elems(shape: tuple[int, ...], rank: int) -> int:
    """Elements a rank-`rank` level sends of a tensor of `shape`: its factors, rank x (rows +
    columns), where they pay, else all of it (`factor_dims`)."""
    dims = factor_dims(shape, rank)
    return math.prod(shape) if dims is None else rank * (dims[0] + dims[1])


class PowerSGD(Codec):
    """Rank-r factors P, Q with M ~= P @ Q.T; 1-D and tiny tensors fall back to dense."""

    lossless = False

    def __init__(self, spec: str, rank: int, factor_dtype: torch.dtype) -> None:
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"powersgd rank must be in [1, {MAX_RANK}], got {rank}")
        self.spec = spec
        self.rank = rank
        self.factor_dtype = factor_dtype
        self.generator = torch.Generator().manual_seed(0)
        """Seeds the first Q; fixed so runs repeat."""
        self._q: torch.Tensor | None = None

    def encode(self, tensor: torch.Tensor) -> Payload:
        shape = tuple(tensor.shape)
        dtype = DTYPE_NAMES[tensor.dtype]
        factors = self._factors(tensor)
        if factors is None:
            return Payload(self.spec, shape, dtype, (tensor_to_bytes(tensor),), (float(DENSE),))
        parts = tuple(tensor_to_bytes(f.reshape(-1)) for f in factors)
        return Payload(self.spec, shape, dtype, parts, (float(FACTORS),))

    def roundtrip(self, tensor: torch.Tensor) -> torch.Tensor:
        """P @ Q.T from the factors as they would travel, without their bytes."""
        factors = self._factors(tensor)
        if factors is None:
            return tensor.detach().clone()
        p, q = factors
        return (p.float() @ q.float().T).to(tensor.dtype).reshape(tensor.shape)

    def _factors(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """P [rows, r] and Q [cols, r] in the wire dtype, contiguous (one power iteration from the
        warm start, which it updates); None where the tensor travels dense."""
        dims = factor_dims(tuple(tensor.shape), self.rank)
        if dims is None:
            return None
        rows, cols = dims
        m = tensor.detach().reshape(rows, cols).float()
        require_finite(m, self.spec)
        q = self._q
        if q is None or q.shape != (cols, self.rank) or q.device != m.device:
            q = torch.randn(cols, self.rank, generator=self.generator).to(m.device)
        p = torch.linalg.qr(m @ q).Q
        q = m.T @ p
        # fp32 products of finite huge entries can still overflow: a NaN basis would stay warm.
        require_finite(q, f"{self.spec} Q factor")
        self._q = q
        # P has orthonormal columns (|P| <= 1); Q = M^T P carries M's scale and may exceed fp16:
        # clamped, it still decodes finite, and error feedback keeps the difference.
        wire = [cast_clamped(f, self.factor_dtype) for f in (p, q)]
        self.clamped += sum(cut for _, cut in wire)
        # Contiguous, as the decoder rebuilds them from the bytes (a [rows, 1] QR factor counts as
        # "contiguous" with a non-unit last stride).
        return wire[0][0].contiguous(), wire[1][0].contiguous()

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        if len(payload.meta) != 1:
            raise CompressionError(f"{self.spec}: expected 1 meta value, got {len(payload.meta)}")
        mode = meta_int(payload.meta[0], DENSE, FACTORS, f"{self.spec} mode")
        dtype = check_payload_header(payload, codec=self.spec, parts=1 if mode == DENSE else 2, meta=1)
        n = checked_numel(payload, self.spec)
        if mode == DENSE:
            expect_bytes(payload.parts[0], n * dtype.itemsize, f"{self.spec} dense values")
            return bytes_to_tensor(payload.parts[0], dtype, n, device).reshape(payload.shape)
        dims = factor_dims(payload.shape, self.rank)
        if dims is None:
            raise CompressionError(f"{self.spec}: shape {payload.shape!r} does not take rank-{self.rank} factors")
        rows, cols = dims
        size = self.factor_dtype.itemsize * self.rank
        expect_bytes(payload.parts[0], rows * size, f"{self.spec} P")
        expect_bytes(payload.parts[1], cols * size, f"{self.spec} Q")
        p = bytes_to_tensor(payload.parts[0], self.factor_dtype, rows * self.rank, device)
        q = bytes_to_tensor(payload.parts[1], self.factor_dtype, cols * self.rank, device)
        require_finite(p, f"{self.spec} P")
        require_finite(q, f"{self.spec} Q")
        m = p.float().view(rows, self.rank) @ q.float().view(cols, self.rank).T
        return m.to(dtype).reshape(payload.shape)

    def reset(self) -> None:
        """Forget the warm-start basis (e.g. after the key's tensor was reinitialized)."""
        self._q = None

    def follow(self, previous: Codec) -> None:
        """Warm-start from `previous`'s basis when it is PowerSGD of another rank on the same matrix:
        one power iteration per step refines the columns in order (the first alone is a power
        iteration, each next one deflated by those before), so the first r columns of a rank-r'
        basis are the top-r subspace found so far. Rank r <= r' takes them; r > r' takes all r'
        and keeps its own last columns r'..r (a random start before it has any). Without it, a
        rank sent for the first time started from a random basis: rank 1's first step after rank
        2 lost 0.38-0.86 of the gradient's energy where rank 2's basis gives 0.05-0.38
        (docs/POLICIES.md, "Switching levels")."""
        if not isinstance(previous, PowerSGD) or previous is self or previous._q is None:
            return
        basis = previous._q
        cols, had = basis.shape
        if had >= self.rank:
            self._q = basis[:, : self.rank].clone()
            return
        own = self._q
        if own is not None and own.shape == (cols, self.rank) and own.device == basis.device:
            rest = own[:, had:]
        else:
            rest = torch.randn(cols, self.rank - had, generator=self.generator).to(basis.device)
        self._q = torch.cat([basis, rest], dim=1)

    def nominal_ratio(self, numel: int) -> float:
        # Planning without a shape: assume a square matrix.
        side = math.isqrt(max(numel, 1))
        if not factors_pay(side, side, self.rank):
            return 1.0
        return min(1.0, 2 * side * self.rank * self.factor_dtype.itemsize / (4 * numel))


def _powersgd(arg: str | None) -> Codec:
    text, suffix = split_suffix(arg, "powersgd")
    if not text.isdigit():
        raise ValueError(f"powersgd rank must be a positive integer, got {text!r}")
    if suffix not in (None, "fp16"):
        raise ValueError(f"powersgd factors are fp32 or +fp16, got +{suffix}")
    factor_dtype = torch.float16 if suffix == "fp16" else torch.float32
    return PowerSGD(f"powersgd:{arg}", int(text), factor_dtype)


register_codec("powersgd", _powersgd)
