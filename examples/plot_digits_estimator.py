"""
=====================================================
Kernel Hebbian PCA as a scikit-learn estimator: digits
=====================================================

:class:`dkha.KernelHebbianPCA` is a scikit-learn transformer: it goes into a
:class:`~sklearn.pipeline.Pipeline`, its parameters are searched by
:class:`~sklearn.model_selection.GridSearchCV`, and its results agree with scikit-learn's
exact :class:`~sklearn.decomposition.KernelPCA`.
"""

# %%
# Data: scikit-learn's handwritten digits.
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import KernelPCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from dkha import KernelHebbianPCA

small = os.environ.get("DKHA_EXAMPLE_SMALL") == "1"
X, y = load_digits(return_X_y=True)
if small:
    X, y = X[:400], y[:400]
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0, stratify=y)

# %%
# KHA-SMD against the exact kernel PCA: the subspace the iterations reach.
sigma = 30.0
kha = KernelHebbianPCA(8, algorithm="kha-smd", sigma=sigma, passes=5 if small else 20)
Y = kha.fit_transform(X_train)
exact = KernelPCA(8, kernel="rbf", gamma=1 / (2 * sigma**2)).fit_transform(X_train)
# principal angles between the two 8-dimensional projections
q1, _ = np.linalg.qr(Y)
q2, _ = np.linalg.qr(exact)
cosines = np.linalg.svd(q1.T @ q2, compute_uv=False)
print(f"KHA-SMD after {kha.history_[-1]['pass']} passes: excess error "
      f"{kha.history_[-1]['excess']:.2e}; smallest principal cosine to KernelPCA "
      f"{cosines.min():.4f}")

# %%
# A pipeline and a grid search over the kernel width and the number of components.
pipe = make_pipeline(StandardScaler(), KernelHebbianPCA(algorithm="krylov"),
                     LogisticRegression(max_iter=2000))
grid = {"kernelhebbianpca__sigma": [4.0, 8.0],
        "kernelhebbianpca__n_components": [8, 24]}
search = GridSearchCV(pipe, grid, cv=2 if small else 3).fit(X_train, y_train)
print("best:", search.best_params_, f"cv accuracy {search.best_score_:.3f}, "
      f"test accuracy {search.score(X_test, y_test):.3f}")

# %%
# Pre-images: back from the projections to digits.
model = search.best_estimator_
kpca = model.named_steps["kernelhebbianpca"]
scaler = model.named_steps["standardscaler"]
Z = scaler.inverse_transform(kpca.inverse_transform(kpca.transform(scaler.transform(X_test[:8]))))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, axes = plt.subplots(2, 8, figsize=(8, 2.3))
for i in range(8):
    axes[0, i].imshow(X_test[i].reshape(8, 8), cmap="gray_r")
    axes[1, i].imshow(Z[i].reshape(8, 8), cmap="gray_r")
    axes[0, i].axis("off")
    axes[1, i].axis("off")
axes[0, 0].set_title("digits", loc="left", fontsize=8)
axes[1, 0].set_title("pre-images", loc="left", fontsize=8)
fig.savefig("digits_preimages.png", dpi=80)
