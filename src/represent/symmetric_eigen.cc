// SymmetricEigen (declared in kvstack/kv_profile.h): Householder reduction to tridiagonal form,
// then the implicit QL iteration with Wilkinson-style shifts on the tridiagonal matrix (the
// EISPACK tred2/tql2 pair), accumulating the eigenvectors. About 9 n^3 flops in all, against
// 3 n^3 per sweep (and 6-10 sweeps) for the cyclic Jacobi method it replaces: calibrate spent
// half its time there at head_dim 128 (the joint [k; v] basis is 256 x 256).
//
// The QL phase keeps the eigenvectors as rows (w[j] is eigenvector j), so that each plane
// rotation touches two contiguous rows.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kvstack/check.h"
#include "kvstack/kv_profile.h"

namespace kvstack {
namespace {

// Reduces the symmetric a ([n][n], row-major, overwritten) to tridiagonal form Q^T a Q: its
// diagonal in d, its subdiagonal in e[1, n) (e[0] = 0), and Q in a (column j of a = column j
// of Q on return).
void Tridiagonalise(std::vector<double>& a, int n, std::vector<double>& d, std::vector<double>& e) {
  auto v = [&a, n](int r, int c) -> double& { return a[static_cast<size_t>(r) * n + c]; };
  for (int j = 0; j < n; ++j) d[j] = v(n - 1, j);
  for (int i = n - 1; i > 0; --i) {
    // Householder vector of row i's first i elements, scaled against under- and overflow.
    double scale = 0.0, h = 0.0;
    for (int k = 0; k < i; ++k) scale += std::fabs(d[k]);
    if (scale == 0.0) {
      e[i] = d[i - 1];
      for (int j = 0; j < i; ++j) {
        d[j] = v(i - 1, j);
        v(i, j) = 0.0;
        v(j, i) = 0.0;
      }
    } else {
      for (int k = 0; k < i; ++k) {
        d[k] /= scale;
        h += d[k] * d[k];
      }
      double f = d[i - 1];
      double g = f > 0 ? -std::sqrt(h) : std::sqrt(h);
      e[i] = scale * g;
      h -= f * g;
      d[i - 1] = f - g;
      for (int j = 0; j < i; ++j) e[j] = 0.0;
      // The similarity transformation applied to the remaining submatrix.
      for (int j = 0; j < i; ++j) {
        f = d[j];
        v(j, i) = f;
        g = e[j] + v(j, j) * f;
        for (int k = j + 1; k <= i - 1; ++k) {
          g += v(k, j) * d[k];
          e[k] += v(k, j) * f;
        }
        e[j] = g;
      }
      f = 0.0;
      for (int j = 0; j < i; ++j) {
        e[j] /= h;
        f += e[j] * d[j];
      }
      const double hh = f / (h + h);
      for (int j = 0; j < i; ++j) e[j] -= hh * d[j];
      for (int j = 0; j < i; ++j) {
        f = d[j];
        g = e[j];
        for (int k = j; k <= i - 1; ++k) v(k, j) -= f * e[k] + g * d[k];
        d[j] = v(i - 1, j);
        v(i, j) = 0.0;
      }
    }
    d[i] = h;
  }
  // Accumulates the transformations into Q.
  for (int i = 0; i < n - 1; ++i) {
    v(n - 1, i) = v(i, i);
    v(i, i) = 1.0;
    const double h = d[i + 1];
    if (h != 0.0) {
      for (int k = 0; k <= i; ++k) d[k] = v(k, i + 1) / h;
      for (int j = 0; j <= i; ++j) {
        double g = 0.0;
        for (int k = 0; k <= i; ++k) g += v(k, i + 1) * v(k, j);
        for (int k = 0; k <= i; ++k) v(k, j) -= g * d[k];
      }
    }
    for (int k = 0; k <= i; ++k) v(k, i + 1) = 0.0;
  }
  for (int j = 0; j < n; ++j) {
    d[j] = v(n - 1, j);
    v(n - 1, j) = 0.0;
  }
  v(n - 1, n - 1) = 1.0;
  e[0] = 0.0;
}

// Diagonalises the tridiagonal (d, e) by implicit QL steps: d becomes the eigenvalues (in no
// particular order) and the rotations are applied to the rows of w ([n][n], row-major), which
// start as Q^T, so that row j ends as the eigenvector of d[j].
void DiagonaliseTridiagonal(std::vector<double>& d, std::vector<double>& e, std::vector<double>& w,
                            int n) {
  auto row = [&w, n](int r) { return w.data() + static_cast<size_t>(r) * n; };
  for (int i = 1; i < n; ++i) e[i - 1] = e[i];
  e[n - 1] = 0.0;
  constexpr double kEps = 0x1p-52;
  constexpr int kMaxIterations = 60;  // per eigenvalue; a few suffice (NaN input ends here)
  double shift_sum = 0.0, norm = 0.0;
  for (int l = 0; l < n; ++l) {
    norm = std::max(norm, std::fabs(d[l]) + std::fabs(e[l]));
    // The first negligible subdiagonal element at or after l (e[n - 1] is 0).
    int m = l;
    while (m < n - 1 && !(std::fabs(e[m]) <= kEps * norm)) ++m;
    for (int iteration = 0; m > l && iteration < kMaxIterations; ++iteration) {
      // The shift: the eigenvalue of the leading 2x2 block closer to d[l].
      double g = d[l];
      double p = (d[l + 1] - g) / (2.0 * e[l]);
      double r = std::hypot(p, 1.0);
      if (p < 0) r = -r;
      d[l] = e[l] / (p + r);
      d[l + 1] = e[l] * (p + r);
      const double dl1 = d[l + 1];
      double h = g - d[l];
      for (int i = l + 2; i < n; ++i) d[i] -= h;
      shift_sum += h;
      // The QL step, as plane rotations from m - 1 down to l.
      p = d[m];
      double c = 1.0, c2 = 1.0, c3 = 1.0, s = 0.0, s2 = 0.0;
      const double el1 = e[l + 1];
      for (int i = m - 1; i >= l; --i) {
        c3 = c2;
        c2 = c;
        s2 = s;
        g = c * e[i];
        h = c * p;
        r = std::hypot(p, e[i]);
        e[i + 1] = s * r;
        s = e[i] / r;
        c = p / r;
        p = c * d[i] - s * g;
        d[i + 1] = h + s * (c * g + s * d[i]);
        double* wi = row(i);
        double* wi1 = row(i + 1);
        for (int k = 0; k < n; ++k) {
          const double next = wi1[k];
          wi1[k] = s * wi[k] + c * next;
          wi[k] = c * wi[k] - s * next;
        }
      }
      p = -s * s2 * c3 * el1 * e[l] / dl1;
      e[l] = s * p;
      d[l] = c * p;
      if (!(std::fabs(e[l]) > kEps * norm)) break;
    }
    d[l] += shift_sum;
    e[l] = 0.0;
  }
}

}  // namespace

void SymmetricEigen(std::vector<double> a, int n, std::vector<double>* values,
                    std::vector<double>* vectors) {
  KVS_CHECK(n >= 1 && a.size() == static_cast<size_t>(n) * n);
  std::vector<double> d(n), e(n);
  Tridiagonalise(a, n, d, e);
  std::vector<double> w(static_cast<size_t>(n) * n);  // Q^T: rows of w are columns of Q
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c)
      w[static_cast<size_t>(c) * n + r] = a[static_cast<size_t>(r) * n + c];
  }
  DiagonaliseTridiagonal(d, e, w, n);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return d[x] > d[y]; });
  values->assign(n, 0.0);
  vectors->assign(static_cast<size_t>(n) * n, 0.0);
  for (int j = 0; j < n; ++j) {
    (*values)[j] = d[order[j]];
    std::copy_n(w.data() + static_cast<size_t>(order[j]) * n, n,
                vectors->data() + static_cast<size_t>(j) * n);
  }
}

}  // namespace kvstack
