"""Generated ratings matrix for matrix factorisation, with Zipf-skewed item popularity.

Nothing is downloaded. Each user and item has a hidden taste vector of ``rank``
dimensions and a bias; a rating is ``3.5 + b_user + b_item + p_user . q_item`` plus
Gaussian noise, rounded to whole stars and clipped to 1..5, as in MovieLens. Which
items get rated follows a Zipf law over a random permutation of the items (a few
blockbusters, a long tail of rarely rated ones), so the gradient rows of popular
items are updated in almost every minibatch and those of the tail rarely: the
skew the IMC'20 paper measured in production sparse models.

``x`` holds (user, item) index pairs as int64, ``y`` the stars as float32; each
(user, item) pair is rated at most once, and train and test pairs are disjoint.
"""

from __future__ import annotations

import numpy as np

from tailcut.ml import data


def make_ratings_dataset(
    seed: int = 0,
    *,
    num_users: int = 400,
    num_items: int = 800,
    rank: int = 4,
    num_ratings: int = 60000,
    zipf_exponent: float = 0.9,
    noise: float = 0.3,
    test_fraction: float = 0.2,
) -> data.Dataset:
    """Generate a deterministic ratings dataset (``num_ratings`` before de-duplication)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction}: must be in (0, 1)")
    if num_ratings > num_users * num_items // 2:
        raise ValueError(f"num_ratings={num_ratings}: at most half of the users x items matrix")
    rng = np.random.default_rng(seed)
    # Taste vectors scaled so that p.q has a standard deviation of about 0.9 stars.
    scale = (0.8 / np.sqrt(rank)) ** 0.5
    p_user = rng.normal(0.0, scale, (num_users, rank))
    q_item = rng.normal(0.0, scale, (num_items, rank))
    b_user = rng.normal(0.0, 0.3, num_users)
    b_item = rng.normal(0.0, 0.5, num_items)

    popularity = 1.0 / np.arange(1, num_items + 1) ** zipf_exponent
    popularity = popularity[rng.permutation(num_items)]
    popularity /= popularity.sum()
    users = rng.integers(0, num_users, num_ratings)
    items = rng.choice(num_items, size=num_ratings, p=popularity)
    # One rating per pair; keep the first draw of a repeated pair, in random order.
    _, first = np.unique(users * num_items + items, return_index=True)
    keep = rng.permutation(first)
    users, items = users[keep], items[keep]

    taste = np.einsum("nk,nk->n", p_user[users], q_item[items])
    latent = 3.5 + b_user[users] + b_item[items] + taste
    stars = np.clip(np.rint(latent + rng.normal(0.0, noise, latent.size)), 1, 5)
    x = np.stack([users, items], axis=1).astype(np.int64)
    y = stars.astype(np.float32)
    num_test = int(round(len(x) * test_fraction))
    return data.Dataset(
        x_train=x[num_test:],
        y_train=y[num_test:],
        x_test=x[:num_test],
        y_test=y[:num_test],
        num_classes=0,
        sizes={"users": num_users, "items": num_items},
    )
