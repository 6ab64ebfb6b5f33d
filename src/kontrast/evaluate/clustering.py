"""Clustering: k-means (k-means++ seeding, restarts), spectral clustering of a weighted graph,
and the scores of a clustering against labels (adjusted Rand index, NMI, adjusted mutual information,
Hungarian accuracy), each beside its chance level on the same split.

Written in torch because the project has no scikit-learn dependency and these are a few
dozen lines; tests check the scores against their textbook formulas and k-means on separated blobs.
The one-to-one matching of clusters to classes is scipy's ``linear_sum_assignment``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _plus_plus(x: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): centres [k, D] drawn ∝ squared distance."""
    centres = [x[torch.randint(len(x), (1,), generator=g)]]  # [1, D]
    d2 = torch.cdist(x, centres[0]).pow(2).squeeze(1)  # [N]
    for _ in range(1, k):
        probs = d2 if d2.sum() > 0 else torch.ones_like(d2)  # all points equal: any is fine
        centres.append(x[torch.multinomial(probs, 1, generator=g)])
        d2 = torch.minimum(d2, torch.cdist(x, centres[-1]).pow(2).squeeze(1))
    return torch.cat(centres)  # [k, D]


def _squared_distances(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """``||x_i - c_j||^2`` as ``|x|^2 - 2 x.c + |c|^2`` (one matrix product): [N, D], [k, D] -> [N, k]."""
    return x.square().sum(1, keepdim=True) - 2 * x @ centres.T + centres.square().sum(1)  # [N, k]


def kmeans(x: torch.Tensor, k: int, *, seed: int = 0, restarts: int = 8, iters: int = 100) -> torch.Tensor:
    """Lloyd's k-means, best of ``restarts`` k-means++ seedings by inertia: [N, D] -> labels [N] int64."""
    if not 1 <= k <= len(x):
        raise ValueError(f"k-means needs 1 <= k <= N, got k={k}, N={len(x)}")
    x = x.double()
    g = torch.Generator().manual_seed(seed)
    best, best_inertia = None, float("inf")
    for _ in range(restarts):
        centres = _plus_plus(x, k, g)  # [k, D]
        labels = None
        for _ in range(iters):
            new = _squared_distances(x, centres).argmin(1)  # [N]
            if labels is not None and torch.equal(new, labels):
                break
            labels = new
            sums = torch.zeros_like(centres).index_add_(0, labels, x)  # [k, D]
            counts = torch.bincount(labels, minlength=k).to(x.dtype)  # [k]
            filled = counts > 0  # an emptied cluster keeps its old centre
            centres[filled] = sums[filled] / counts[filled, None]
        inertia = float(_squared_distances(x, centres).gather(1, labels[:, None]).clamp_min(0).sum())
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def contingency(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``n_ij``: how many samples labelling ``a`` puts in its i-th class and ``b`` in its j-th, [Ka, Kb] float64.

    Labels are renamed to 0..K-1 in sorted order first; both must be [N] of one length.
    """
    a, b = torch.as_tensor(a).long(), torch.as_tensor(b).long()
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"labelings must be two [N] tensors, got {tuple(a.shape)} and {tuple(b.shape)}")
    _, a = a.unique(return_inverse=True)
    _, b = b.unique(return_inverse=True)
    kb = int(b.max()) + 1
    table = torch.bincount(a * kb + b, minlength=(int(a.max()) + 1) * kb).double()  # [Ka*Kb]
    return table.view(-1, kb)  # [Ka, Kb]


def normalized_mutual_info(a: torch.Tensor, b: torch.Tensor) -> float:
    """``I(a; b) / ((H(a) + H(b)) / 2)`` of two labelings [N], in [0, 1] (Strehl & Ghosh 2002, arithmetic mean).

    1 when one labeling is the other renamed; two trivial (one-cluster) labelings give 1.
    """
    p = contingency(a, b) / len(torch.as_tensor(a))  # [Ka, Kb] joint
    pa, pb = p.sum(1), p.sum(0)  # [Ka], [Kb] marginals
    nz = p > 0
    mi = float((p[nz] * (p[nz] / (pa[:, None] * pb[None, :])[nz]).log()).sum())
    ha, hb = float(-(pa * pa.log()).sum()), float(-(pb * pb.log()).sum())
    if ha + hb == 0:
        return 1.0
    return max(mi, 0.0) / ((ha + hb) / 2)


def hungarian_accuracy(clusters: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy of the clusters after the best one-to-one matching of clusters to classes [N] -> [0, 1].

    The matching maximises the samples on the diagonal of the contingency table (Kuhn's Hungarian
    method, scipy's ``linear_sum_assignment``); with more clusters than classes the extra ones score 0.
    """
    table = contingency(clusters, labels)  # [Kc, Ky]
    from scipy.optimize import linear_sum_assignment  # here: every training process imports this module (monitor)

    rows, cols = linear_sum_assignment(table.numpy(), maximize=True)
    return float(table[rows, cols].sum()) / len(torch.as_tensor(labels))


def cluster_scores(features: torch.Tensor, labels: torch.Tensor, *, seed: int = 0,
                   chance_draws: int = 20) -> dict[str, float]:
    """k-means with as many clusters as classes on L2-normalised features [N, D], scored against labels [N].

    Normalised because the methods train cosine geometry (the kNN monitor reads cosine too). Returns
    ``kmeans_nmi``, ``kmeans_ami``, ``kmeans_ari``, ``kmeans_acc`` (accuracy after Hungarian matching) and for
    each its ``_chance``: the mean score of ``chance_draws`` random assignments with the same cluster sizes
    (the clusters' labels shuffled over the samples). NMI and accuracy are far from 0 by chance on a small
    split; AMI and ARI are corrected for it (their chance level is about 0).
    """
    k = int(torch.as_tensor(labels).unique().numel())
    clusters = kmeans(F.normalize(features.double(), dim=1), k, seed=seed, restarts=4)  # [N]
    out = clustering_scores(clusters, labels)
    g = torch.Generator().manual_seed(seed)
    draws = [clustering_scores(clusters[torch.randperm(len(clusters), generator=g)], labels)
             for _ in range(chance_draws)]
    out.update({f"{name}_chance": sum(d[name] for d in draws) / chance_draws for name in list(out)})
    return out


def clustering_scores(clusters: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """NMI, AMI, ARI and Hungarian accuracy of a clustering [N] against labels [N], as ``kmeans_*``."""
    return {"kmeans_nmi": normalized_mutual_info(clusters, labels),
            "kmeans_ami": adjusted_mutual_info(clusters, labels),
            "kmeans_ari": adjusted_rand_index(clusters, labels),
            "kmeans_acc": hungarian_accuracy(clusters, labels)}


def _entropy(p: torch.Tensor) -> float:
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def expected_mutual_info(a_sizes: torch.Tensor, b_sizes: torch.Tensor) -> float:
    """E[I(a; b)] over labelings with these cluster sizes drawn at random (the hypergeometric model; Vinh,
    Epps & Bailey 2010, https://jmlr.org/papers/v11/vinh10a.html, eq. 24a): sizes [Ka], [Kb] -> nats.

    ``sum_ij sum_n n/N log(N n / (a_i b_j)) P(n_ij = n)``, ``n`` from ``max(1, a_i + b_j - N)`` to
    ``min(a_i, b_j)``, with the hypergeometric probability in log-gamma form (float64)."""
    a, b = a_sizes.double(), b_sizes.double()  # [Ka], [Kb]
    n_total = float(a.sum())
    n = torch.arange(1, int(min(a.max(), b.max())) + 1, dtype=torch.float64)  # [M] every possible n_ij
    ai, bj, nn_ = a[:, None, None], b[None, :, None], n[None, None, :]  # [Ka,1,1], [1,Kb,1], [1,1,M]
    valid = (nn_ >= (ai + bj - n_total).clamp_min(1)) & (nn_ <= torch.minimum(ai, bj))  # [Ka, Kb, M]
    lg = torch.lgamma
    log_p = (lg(ai + 1) + lg(bj + 1) + lg(n_total - ai + 1) + lg(n_total - bj + 1)
             - lg(torch.tensor(n_total + 1, dtype=torch.float64))
             - lg(nn_ + 1) - lg((ai - nn_).clamp_min(0) + 1) - lg((bj - nn_).clamp_min(0) + 1)
             - lg((n_total - ai - bj + nn_).clamp_min(0) + 1))  # [Ka, Kb, M] log P(n_ij = n)
    term = nn_ / n_total * torch.log(n_total * nn_ / (ai * bj)) * log_p.exp()  # [Ka, Kb, M]
    return float(torch.where(valid, term, torch.zeros(())).sum())


def adjusted_mutual_info(a: torch.Tensor, b: torch.Tensor) -> float:
    """``(I - E[I]) / ((H(a) + H(b)) / 2 - E[I])`` of two labelings [N] (Vinh et al. 2010; scikit-learn's
    ``adjusted_mutual_info_score`` with its default arithmetic mean): 1 identical up to renaming, about 0 by
    chance (:func:`expected_mutual_info`). Two identical trivial labelings give 1."""
    table = contingency(a, b)  # [Ka, Kb]
    p = table / table.sum()
    pa, pb = p.sum(1), p.sum(0)
    nz = p > 0
    mi = float((p[nz] * (p[nz] / (pa[:, None] * pb[None, :])[nz]).log()).sum())
    emi = expected_mutual_info(table.sum(1), table.sum(0))
    top = (_entropy(pa) + _entropy(pb)) / 2
    if top == emi:  # both labelings trivial
        return 1.0
    return (mi - emi) / (top - emi)


def adjusted_rand_index(a: torch.Tensor, b: torch.Tensor) -> float:
    """Hubert & Arabie's adjusted Rand index of two labelings [N]: 1 identical up to renaming, ~0 chance.

    From the contingency table ``n_ij``: ``(sum C(n_ij,2) - E) / (mean(sum C(a_i,2), sum C(b_j,2)) - E)``
    with ``E = sum C(a_i,2) sum C(b_j,2) / C(N,2)``. Two identical trivial labelings give 1.
    """
    table = contingency(a, b)  # [Ka, Kb]
    n = len(torch.as_tensor(a))

    def pairs(t: torch.Tensor) -> float:
        return float((t * (t - 1) / 2).sum())

    both, rows, cols = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
    expected = rows * cols / (n * (n - 1) / 2)
    top = (rows + cols) / 2
    if top == expected:  # both labelings trivial (one cluster, or all singletons)
        return 1.0
    return (both - expected) / (top - expected)


def normalized_adjacency(adjacency: torch.Tensor) -> torch.Tensor:
    """``D^(-1/2) A D^(-1/2)``: [n, n] -> [n, n]; its eigenvalues lie in [-1, 1], the top one is 1."""
    s = adjacency.sum(1).rsqrt()  # [n] D^(-1/2)
    return s[:, None] * adjacency * s[None, :]  # [n, n]


def spectral_embedding(adjacency: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k eigenpairs of the normalised adjacency, largest first.

    Returns ``(eigenvalues [k], eigenvectors [n, k])`` with orthonormal columns (float64).
    The first eigenvector is ``sqrt(degree / total)``; eigenvectors of repeated eigenvalues
    are any orthonormal basis of their space (compare spans, never single columns).
    """
    values, vectors = torch.linalg.eigh(normalized_adjacency(adjacency.double()))  # ascending
    order = values.argsort(descending=True)[:k]  # [k]
    return values[order], vectors[:, order]


def spectral_clustering(adjacency: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """Shi & Malik's normalised-cut spectral clustering: k-means on the rows of ``D^(-1/2) U_k``.

    (https://doi.org/10.1109/34.868688; the rows are the random-walk Laplacian's eigenvectors,
    the embedding the spectral loss learns up to a linear map.) Returns labels [n].
    """
    _, u = spectral_embedding(adjacency, k)  # [n, k]
    rows = u * adjacency.sum(1).rsqrt()[:, None]  # [n, k] D^(-1/2) U_k
    return kmeans(rows, k, seed=seed)
