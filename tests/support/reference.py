"""Reference formulas written from the papers, the naive way (loops, float64): every loss test compares with these.

One definition each, so a formula is read and checked once. Each docstring names the equation it transcribes.
"""

from __future__ import annotations

import math

import torch

from kontrast.losses.redundancy import BN_EPS


def cosine64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos(a, b) of two vectors in float64 (0-d tensor)."""
    a, b = a.double(), b.double()
    return (a @ b) / (a.norm() * b.norm())


def unit64(z: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length in float64; an all-zero row stays zero (F.normalize's convention)."""
    z = z.detach().double()
    return z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)


def cross_entropy64(scores, positive: int, exclude: int | None = None) -> float:
    """-log(exp(s_pos) / sum_j exp(s_j)) for one row of scores, float64, max-shifted (stable at tiny tau)."""
    s = [float(v) for v in scores]
    m = max(v for j, v in enumerate(s) if j != exclude)
    den = sum(math.exp(v - m) for j, v in enumerate(s) if j != exclude)
    return -(s[positive] - m - math.log(den))


def naive_nt_xent(z1, z2, tau) -> float:
    """SimCLR eq. 1 (Chen et al. 2020): l(i, j) = -log exp(s_ij / t) / sum_{k != i} exp(s_ik / t), s = cosine,
    the positive of view i the other view of its image, averaged over all 2N anchors."""
    z = unit64(torch.cat([z1, z2]))
    b = z1.shape[0]
    s = z @ z.T / tau
    return sum(cross_entropy64(s[i], (i + b) % (2 * b), exclude=i) for i in range(2 * b)) / (2 * b)


def naive_moco(q, k, queue, tau) -> float:
    """MoCo eq. 1 (He et al. 2020): -log exp(q.k+ / t) / (exp(q.k+ / t) + sum_queue exp(q.k- / t)), normalised
    q, k and queue; column 0 is the own key."""
    qn, kn, keys = unit64(q), unit64(k), unit64(queue)
    return sum(cross_entropy64(torch.cat([(qn[i] @ kn[i])[None], keys @ qn[i]]) / tau, 0)
               for i in range(len(q))) / len(q)


def naive_info_nce(a, c, positives, tau, exclude=None):
    """float64 loop over rows, from van den Oord et al. 2018 eq. 4 with cosine / tau scores."""
    total = 0.0
    for i in range(a.shape[0]):
        ai = a[i] / a[i].norm()
        s = [float(ai @ (c[j] / c[j].norm())) / tau for j in range(c.shape[0])]
        denom = sum(math.exp(v) for j, v in enumerate(s) if exclude is None or j != int(exclude[i]))
        total += -(s[int(positives[i])] - math.log(denom))
    return total / a.shape[0]


def naive_nce(pos, noise, z, n):
    """Wu et al. 2018, eqs. 5-7: P = exp(s)/Z, h = P / (P + m/n);
    L = -log h(pos) - sum_noise log(1 - h(noise)), averaged over the batch."""
    m = len(noise[0])
    total = 0.0
    for i in range(len(pos)):
        p = math.exp(float(pos[i])) / z
        term = -math.log(p / (p + m / n))
        for s in noise[i]:
            q = math.exp(float(s)) / z
            term -= math.log(1 - q / (q + m / n))
        total += term
    return total / len(pos)


def naive_spectral(z1, z2, mu):
    """HaoChen et al. 2021, eq. for L(f) on a batch: -2 mean_i f(x_i).f(x_i+) + mean_{i != j} (f(x_i).f(x_j+))^2,
    after the recipe's norm clip to sqrt(mu), divided by mu."""
    def clip(v):
        n = math.sqrt(sum(float(x) ** 2 for x in v))
        return [float(x) * (math.sqrt(mu) / n if n >= math.sqrt(mu) else 1.0) for x in v]

    u, v = [clip(r) for r in z1], [clip(r) for r in z2]
    b = len(u)
    dot = lambda x, y: sum(p * q for p, q in zip(x, y))  # noqa: E731
    pos = sum(dot(u[i], v[i]) for i in range(b)) / b
    neg = sum(dot(u[i], v[j]) ** 2 for i in range(b) for j in range(b) if i != j) / (b * (b - 1))
    return (-2 * pos + neg) / mu


def naive_dcl(z1, z2, tau, sigma=None, weight_gradient=False):
    """Eq. 6 loop by loop: for view k of image i, -w_i cos(z_i^1, z_i^2)/tau + log sum over the 2(B-1) views of
    the other images of exp(cos/tau); mean over the 2B anchors. DCLW: w_i = 2 - exp(cos_ii'/sigma) / mean_j
    exp(cos_jj'/sigma); ``weight_gradient``: computed from the tensors, so the gradient flows through it (the
    authors' ``weight_fn``), else from plain floats, a constant (lightly's)."""
    b = z1.shape[0]
    z = torch.cat([z1, z2])
    pos_cos = [cosine64(z1[j], z2[j]) if weight_gradient else float(cosine64(z1[j], z2[j]).detach()) for j in range(b)]
    exp = torch.exp if weight_gradient else math.exp
    mean_exp = sum(exp(c / sigma) for c in pos_cos) / b if sigma else None
    total = 0
    for i in range(2 * b):
        image, other = i % b, (i + b) % (2 * b)
        w = 2 - exp(pos_cos[image] / sigma) / mean_exp if sigma else 1.0
        negatives = sum(torch.exp(cosine64(z[i], z[k]) / tau) for k in range(2 * b) if k not in (i, other))
        total = total - w * cosine64(z[i], z[other]) / tau + torch.log(negatives)
    return total / (2 * b)


def naive_dino(student, teacher, centre, tau_s, tau_t):
    """Eq. 3 with the authors' averaging, loop by loop in float64: for each global view a the teacher saw and each
    other view v, the batch mean of H(P_t, P_s) = -sum_k P_t,k log P_s,k with P_t = softmax((t - c) / tau_t) (no
    gradient) and P_s = softmax(s / tau_s); then the mean over those pairs."""
    n_views, batch, k = student.shape
    total, pairs = 0.0, 0
    for a in range(teacher.shape[0]):
        for v in range(n_views):
            if v == a:
                continue
            pair = 0.0
            for b in range(batch):
                # plain floats: no grad
                t = [(float(teacher[a, b, j].detach()) - float(centre[j])) / tau_t for j in range(k)]
                z_t = sum(math.exp(x) for x in t)
                log_z_s = torch.log(sum(torch.exp(student[v, b, j] / tau_s) for j in range(k)))
                pair = pair - sum(math.exp(t[j]) / z_t * (student[v, b, j] / tau_s - log_z_s) for j in range(k))
            total, pairs = total + pair / batch, pairs + 1
    return total / pairs


def naive_vicreg(z1, z2, lam, mu, nu, eps=1e-4, variance_views="sum"):
    """Bardes et al. 2022, eq. 1-6 / Algorithm 1, term by term with loops: (total, s, v(z1) + v(z2), c(z1) + c(z2));
    ``variance_views="mean"``: the authors' main_vicreg.py, v(z1) / 2 + v(z2) / 2."""
    n, d = z1.shape
    s = sum((z1[b, i] - z2[b, i]) ** 2 for b in range(n) for i in range(d)) / (n * d)  # MSE
    v, c = 0.0, 0.0
    for z in (z1, z2):
        means = [sum(z[b, i] for b in range(n)) / n for i in range(d)]
        for i in range(d):
            var = sum((z[b, i] - means[i]) ** 2 for b in range(n)) / (n - 1)
            share = 2 if variance_views == "mean" else 1
            v = v + torch.clamp(1 - torch.sqrt(var + eps), min=0) / d / share  # hinge at gamma = 1, mean over dims
        for i in range(d):
            for j in range(d):
                if i != j:
                    cov = sum((z[b, i] - means[i]) * (z[b, j] - means[j]) for b in range(n)) / (n - 1)
                    c = c + cov ** 2 / d
    return lam * s + mu * v + nu * c, s, v, c


def naive_barlow_twins(z1, z2, lambd):
    """Zbontar et al. 2021, eq. 1-2: C_ij = sum_b zn1_bi zn2_bj / N over batch-standardised z (BN: biased
    variance, eps 1e-5); (sum_i (1 - C_ii)^2 + lambd * sum_{i != j} C_ij^2, the two sums). Loops over dimensions
    and samples."""
    n, d = z1.shape

    def standardized(z):
        cols = []
        for i in range(d):
            col = [z[b, i] for b in range(n)]
            mean = sum(col) / n
            var = sum((x - mean) ** 2 for x in col) / n
            cols.append([(x - mean) / torch.sqrt(var + BN_EPS) for x in col])
        return cols  # cols[i][b]

    a, b = standardized(z1), standardized(z2)
    on_diag, off_diag = 0.0, 0.0
    for i in range(d):
        for j in range(d):
            c_ij = sum(a[i][k] * b[j][k] for k in range(n)) / n
            if i == j:
                on_diag = on_diag + (1 - c_ij) ** 2
            else:
                off_diag = off_diag + c_ij ** 2
    return on_diag + lambd * off_diag, on_diag, off_diag


def naive_shared_negatives(scores, pos, neg):
    """One InfoNCE term per positive pair: -log e^{s_ij} / (e^{s_ij} + sum_{m in neg(i)} e^{s_im})."""
    terms = []
    for i in range(scores.shape[0]):
        negs = sum(math.exp(float(scores[i, m])) for m in range(scores.shape[1]) if neg[i, m])
        for j in range(scores.shape[1]):
            if pos[i, j]:
                e = math.exp(float(scores[i, j]))
                terms.append(-math.log(e / (e + negs)))
    return sum(terms) / len(terms)


def naive_swapped_prediction(scores, codes, temperature):
    """Eq. 1-2 of the paper in float64 with loops: l(z_t, q_s) = -sum_k q_s^k log p_t^k, averaged."""
    v_views, b, k = scores.shape
    a_views = codes.shape[0]
    total, pairs = 0.0, 0
    for a in range(a_views):
        for v in range(v_views):
            if v == a:
                continue
            for i in range(b):
                logits = [scores[v, i, j].item() / temperature for j in range(k)]
                log_z = math.log(sum(math.exp(x) for x in logits))
                total += -sum(codes[a, i, j].item() * (logits[j] - log_z) for j in range(k)) / b
            pairs += 1
    return total / pairs


def naive_sinkhorn(scores, epsilon, iterations):
    """Caron et al. 2020, Algorithm 1 (``distributed_sinkhorn``), float64, Q as [K, B] with explicit loops."""
    s = scores.double()
    b, k = s.shape
    q = [[math.exp(s[i, j].item() / epsilon) for i in range(b)] for j in range(k)]  # [K][B]
    total = sum(map(sum, q))
    q = [[v / total for v in row] for row in q]
    for _ in range(iterations):
        for j in range(k):  # each prototype gets 1/K of the mass
            r = sum(q[j])
            q[j] = [v / r / k for v in q[j]]
        for i in range(b):  # each sample gets 1/B of the mass
            c = sum(q[j][i] for j in range(k))
            for j in range(k):
                q[j][i] = q[j][i] / c / b
    return torch.tensor([[q[j][i] * b for j in range(k)] for i in range(b)], dtype=torch.float64)  # [B, K]


def naive_knn(train, train_labels, test, k, temperature, num_classes):
    """Wu et al. 2018, sec. 3.4, one test sample at a time in float64 Python."""
    train = [row / row.norm() for row in train.double()]
    preds = []
    for q in test.double():
        q = q / q.norm()
        sims = sorted(((float(q @ t), i) for i, t in enumerate(train)), reverse=True)[:k]
        votes = [0.0] * num_classes
        for sim, i in sims:
            votes[int(train_labels[i])] += math.exp(sim / temperature)
        preds.append(max(range(num_classes), key=votes.__getitem__))
    return torch.tensor(preds)


def naive_nmi(a: list[int], b: list[int]) -> float:
    """Strehl & Ghosh's NMI, arithmetic-mean normalisation, from the sums over samples."""
    n = len(a)
    pa = {x: a.count(x) / n for x in set(a)}
    pb = {y: b.count(y) / n for y in set(b)}
    pab = {(x, y): sum(1 for i in range(n) if a[i] == x and b[i] == y) / n for x in pa for y in pb}
    mi = sum(p * math.log(p / (pa[x] * pb[y])) for (x, y), p in pab.items() if p > 0)
    h = lambda q: -sum(p * math.log(p) for p in q.values())  # noqa: E731
    return mi / ((h(pa) + h(pb)) / 2)


def naive_ami(a: list[int], b: list[int]) -> float:
    """Vinh, Epps & Bailey 2010: (MI - E[MI]) / (mean(H(a), H(b)) - E[MI]), with E[MI] summed over every
    possible cell count under the hypergeometric model, P(n_ij = n) = C(a_i, n) C(N - a_i, b_j - n) / C(N, b_j)."""
    n = len(a)
    sa = [a.count(x) for x in sorted(set(a))]
    sb = [b.count(y) for y in sorted(set(b))]
    emi = 0.0
    for ai in sa:
        for bj in sb:
            for nij in range(max(1, ai + bj - n), min(ai, bj) + 1):
                p = math.comb(ai, nij) * math.comb(n - ai, bj - nij) / math.comb(n, bj)
                emi += p * nij / n * math.log(n * nij / (ai * bj))
    nmi_value = naive_nmi(a, b)
    h = lambda sizes: -sum(s / n * math.log(s / n) for s in sizes)  # noqa: E731
    mean_h = (h(sa) + h(sb)) / 2
    mi = nmi_value * mean_h
    return (mi - emi) / (mean_h - emi)


def naive_siglip(x, y, log_t, bias):
    """SigLIP's loss, Zhai et al. 2023 eq. 1: -1/|B| sum_i sum_j log 1 / (1 + exp(z_ij (-t x_i.y_j - b))), x and y
    normalised, t = exp(t'), z_ij = 1 on the diagonal and -1 elsewhere; a float64 tensor with autograd."""
    n, total = x.shape[0], 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            s = (x[i] / x[i].norm()) @ (y[j] / y[j].norm())
            total = total + torch.log(1 / (1 + torch.exp(z * (-torch.exp(log_t) * s - bias))))
    return -total / n


def naive_supcon(z, labels, tau):
    """SupCon's L_out, Khosla et al. 2020 eq. 2, averaged over the anchors: for each of the 2N views i,
    -1/|P(i)| sum_{p in P(i)} log(exp(z_i.z_p/tau) / sum_{a != i} exp(z_i.z_a/tau)), z normalised; float64 tensor."""
    z = z / z.norm(dim=1, keepdim=True)
    n, total = z.shape[0], 0.0
    for i in range(n):
        den = sum(torch.exp(z[i] @ z[a] / tau) for a in range(n) if a != i)
        pos = [p for p in range(n) if p != i and labels[p] == labels[i]]
        total = total - sum(torch.log(torch.exp(z[i] @ z[p] / tau) / den) for p in pos) / len(pos)
    return total / n


def naive_mmcr(z, local_weight=0.0):
    """MMCR's loss, Yerxa et al. 2023 section 3, float64: z [N, k, D] normalised views; c_i = 1/k sum_j z_ij;
    -||C||_* + lambda / N sum_i ||Z_i||_*, each nuclear norm written as trace(sqrt(M^T M)) = sum sqrt(eig(M^T M))."""
    def nuclear(m):
        eig = torch.linalg.eigvalsh(m.T @ m).clamp_min(0)  # [D] squared singular values (and zeros)
        return eig.sqrt().sum()
    c = torch.stack([sum(z[i, j] for j in range(z.shape[1])) / z.shape[1] for i in range(z.shape[0])])  # [N, D]
    local = sum(nuclear(z[i]) for i in range(z.shape[0])) / z.shape[0]
    return -nuclear(c) + local_weight * local


def naive_sigreg(z, directions, t_max=3.0, knots=17):
    """SIGReg, Balestriero & LeCun 2025, float64: for each unit direction a (a column of ``directions``), the
    Epps-Pulley statistic N * integral_{-t_max}^{t_max} |1/N sum_n exp(i t a.z_n) - exp(-t^2/2)|^2 exp(-t^2/2) dt by the
    trapezoidal rule on the symmetric grid of 2 knots - 1 points; the mean over directions."""
    n = z.shape[0]
    t = torch.linspace(-t_max, t_max, 2 * knots - 1, dtype=torch.float64)
    stats = []
    for m in range(directions.shape[1]):
        x = z @ directions[:, m]  # [N]
        ecf = torch.exp(1j * t[None, :] * x[:, None]).mean(0)  # [T] complex
        gauss = torch.exp(-t**2 / 2)
        stats.append(n * torch.trapezoid((ecf - gauss).abs() ** 2 * gauss, t))
    return sum(stats) / len(stats)


def naive_lejepa(z, global_views, directions, weight, t_max=3.0, knots=17):
    """LeJEPA's loss, float64: (1 - lambda) * mean over views, samples and dims of (mu - z)^2 with mu the global
    views' mean, + lambda * the mean over views of SIGReg."""
    mu = sum(z[v] for v in range(global_views)) / global_views
    invariance = sum(((mu - z[v]) ** 2).mean() for v in range(z.shape[0])) / z.shape[0]
    reg = sum(naive_sigreg(z[v], directions, t_max, knots) for v in range(z.shape[0])) / z.shape[0]
    return (1 - weight) * invariance + weight * reg


def naive_koleo(x):
    """KoLeo, Sablayrolles et al. 2019 eq. 4 (DINOv2's form), float64: x normalised, -1/n sum_i log(min_{j != i}
    ||x_i - x_j|| + 1e-8), the minimum found by trying every j."""
    x = x / x.norm(dim=1, keepdim=True)
    n = x.shape[0]
    total = 0.0
    for i in range(n):
        d = min((x[i] - x[j]).norm() for j in range(n) if j != i)
        total = total - torch.log(d + 1e-8)
    return total / n


def naive_ibot_patch(student, targets, mask, tau_s):
    """iBOT's masked-patch loss (Zhou et al. 2022 eq. 2) in DINOv2's weighting, float64: for every image b of the B
    in ``mask [B, N]``, the mean over its masked patches of -sum_k target_k log softmax(student / tau_s)_k; the sum over
    images divided by B. ``student``, ``targets`` [M, K]: the masked patches in mask order."""
    total, row = 0.0, 0
    for b in range(mask.shape[0]):
        count = int(mask[b].sum())
        for _ in range(count):
            log_p = student[row] / tau_s - torch.logsumexp(student[row] / tau_s, 0)
            total = total - (targets[row] * log_p).sum() / count
            row += 1
    return total / mask.shape[0]


def naive_cross_entropy(logits, labels):
    """The supervised reference's loss: - mean_i log softmax(logits_i)_{y_i}, in float64, one row at a time."""
    logits = logits.double()
    total = 0.0
    for row, y in zip(logits, labels.tolist()):
        total = total - (row[y] - torch.log(torch.exp(row).sum()))
    return total / logits.shape[0]


def naive_mae(prediction, image, masked, patch, norm_pix=True, eps=1e-6):
    """MAE's loss, He et al. 2022 sec. 3, float64: for every image b and each of its masked patches k
    (``masked [B, m]``, row-major on the grid), the patch's pixels cut out of ``image [B, C, H, W]`` (row by row,
    channels last: the authors' patchify), with ``norm_pix`` normalised by their own mean and unbiased variance (the
    authors' code: (x - mean) / sqrt(var + 1e-6)); the squared error to ``prediction[b, j]`` averaged over the pixels,
    then over all masked patches of the batch."""
    columns = image.shape[-1] // patch
    total, count = 0.0, 0
    for b in range(masked.shape[0]):
        for j, k in enumerate(masked[b].tolist()):
            row, col = divmod(k, columns)
            pixels = image[b, :, row * patch:(row + 1) * patch, col * patch:(col + 1) * patch]  # [C, p, p]
            t = pixels.permute(1, 2, 0).reshape(-1)  # [p p C]
            if norm_pix:
                mean = t.sum() / t.numel()
                var = ((t - mean) ** 2).sum() / (t.numel() - 1)
                t = (t - mean) / torch.sqrt(var + eps)
            total = total + ((prediction[b, j] - t) ** 2).sum() / t.numel()
            count += 1
    return total / count


def naive_ijepa(predictions, target_tokens, targets, loss="l2", eps=1e-5):
    """I-JEPA's loss, Assran et al. 2023 sec. 3, float64: for every image b, target block i and patch j of it
    (``targets [B, M, k]``), the target encoder's token ``target_tokens[b, targets[b, i, j]]`` (``[B, h·w, D]``)
    normalised over its D features (mean, biased variance, eps 1e-5: the authors' ``F.layer_norm``), against
    ``predictions[b][i][j]`` (a list of lists of ``[k, D]``, one predictor pass per image and block); the squared
    error (or smooth L1, beta 1) averaged over every feature of every target patch."""
    total, count = 0.0, 0
    for b in range(targets.shape[0]):
        for i in range(targets.shape[1]):
            for j, patch in enumerate(targets[b, i].tolist()):
                s = target_tokens[b, patch]  # [D]
                mean = s.sum() / s.numel()
                var = ((s - mean) ** 2).sum() / s.numel()
                e = predictions[b][i][j] - (s - mean) / torch.sqrt(var + eps)  # [D]
                if loss == "l2":
                    total = total + (e ** 2).sum()
                else:
                    total = total + torch.where(e.abs() < 1, e ** 2 / 2, e.abs() - 0.5).sum()
                count += s.numel()
    return total / count
