"""SIGReg and LeJEPA's loss (Balestriero & LeCun 2025, "LeJEPA: Provable and Scalable Self-Supervised Learning
Without the Heuristics", https://arxiv.org/abs/2511.08544).

SIGReg (sketched isotropic Gaussian regularisation) tests whether N embeddings look like draws from N(0, I): it
projects them on M random unit directions a_m and, on each, compares the empirical characteristic function
``phi_N(t) = 1/N sum_n exp(i t a_m.z_n)`` with the standard normal's ``phi(t) = exp(-t^2 / 2)`` by the
Epps-Pulley statistic

    EP_m = N * integral |phi_N(t) - phi(t)|^2 w(t) dt,   w(t) = exp(-t^2 / 2),

the integral over [-t_max, t_max] by the trapezoidal rule (the integrand is even: twice the integral over
[0, t_max], on ``knots`` points). SIGReg is the mean of EP_m over the directions. LeJEPA's loss over V views
``z [V, N, D]``, the first G of them global:

    L = (1 - lambda) * mean_{v, n, d} (mu_nd - z_vnd)^2  +  lambda * mean_v SIGReg(z_v),
    mu = mean of the G global views

a prediction of every view's embedding from the global views' centre, kept from collapse by SIGReg alone.
"""

from __future__ import annotations

import torch

from kontrast.precision import at_least_float32


def unit_directions(dim: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``[dim, count]`` directions uniform on the sphere (normalised Gaussian columns), from ``generator``."""
    a = torch.randn(dim, count, generator=generator)  # [D, M]
    return a / a.norm(dim=0)


def epps_pulley(x: torch.Tensor, t_max: float = 3.0, knots: int = 17) -> torch.Tensor:
    """The Epps-Pulley statistic of each column of ``x [N, M]`` against N(0, 1): ``[M]`` (module docstring)."""
    x = at_least_float32(x)
    t = torch.linspace(0, t_max, knots, dtype=x.dtype, device=x.device)  # [T] frequencies, the even half
    phi = torch.exp(-t.square() / 2)  # [T] N(0, 1)'s characteristic function, also the weight w(t)
    xt = x[..., None] * t  # [N, M, T] t a.z
    re, im = xt.cos().mean(0), xt.sin().mean(0)  # [M, T] phi_N(t)'s real and imaginary parts
    error = (re - phi).square() + im.square()  # [M, T] |phi_N(t) - phi(t)|^2
    dt = t_max / (knots - 1)
    trapezoid = torch.full((knots,), 2 * dt, dtype=x.dtype, device=x.device)  # [T] twice [dt/2, dt, ..., dt/2]
    trapezoid[[0, -1]] = dt
    return x.shape[0] * (error * phi) @ trapezoid  # [M] N * integral |.|^2 w(t) dt


def sigreg(z: torch.Tensor, directions: torch.Tensor, t_max: float = 3.0, knots: int = 17) -> torch.Tensor:
    """SIGReg of ``z [N, D]`` on ``directions [D, M]``: the mean Epps-Pulley statistic of the projections, 0-d."""
    return epps_pulley(at_least_float32(z) @ directions.to(at_least_float32(z).dtype), t_max, knots).mean()


def lejepa_loss(z: torch.Tensor, global_views: int, directions: torch.Tensor, weight: float = 0.05,
                t_max: float = 3.0, knots: int = 17) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LeJEPA's loss of ``z [V, N, D]`` (the first ``global_views`` global), ``weight`` lambda on SIGReg:
    ``(loss, invariance, sigreg)``, each 0-d."""
    z = at_least_float32(z)
    centre = z[:global_views].mean(0)  # [N, D] mu: the global views' mean embedding
    invariance = (centre - z).square().mean()  # every view predicts mu
    regulariser = torch.stack([sigreg(view, directions, t_max, knots) for view in z]).mean()  # mean over views
    return (1 - weight) * invariance + weight * regulariser, invariance, regulariser
