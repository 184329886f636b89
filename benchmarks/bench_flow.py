"""The landscape's integrator: one vectorised Dormand-Prince loop over many trajectories, each with its own
adaptive step (`landscape.flow._dormand_prince`), against `scipy.integrate.solve_ivp` (RK45, the same 5(4)
pair and tolerances) called once per trajectory, measured in the same process on the same inits.

The inits are a grid of the (w0, e0) plane, as `landscape.regime_map_init` uses, on the tied (e, w, b) flow of
the p = 0.5, q = 0.8 chain from b0 = 0, integrated to a fixed time (no early stopping, which only the
hand-written loop has). Prints seconds, the ratio and the largest difference of the final states.

    python benchmarks/bench_flow.py [--n 20] [--t-end 200] [--rtol 1e-8]
"""

import argparse
import time

import numpy as np
from scipy.integrate import solve_ivp

from markov_interp.landscape import canonical, flow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="grid side: n x n trajectories")
    parser.add_argument("--t-end", type=float, default=200.0)
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--atol", type=float, default=1e-11)
    args = parser.parse_args()
    p, q = 0.5, 0.8
    ww, ee = np.meshgrid(np.linspace(-2.5, 1.5, args.n), np.linspace(0.02, 2.5, args.n))
    x0 = np.stack([ee.ravel(), ww.ravel(), np.zeros(ee.size)], axis=1)

    def field(idx):
        return lambda y: -canonical._tied_grad_np(y, p, q)

    start = time.perf_counter()
    x, _ = flow._dormand_prince(field, x0, args.t_end, rtol=args.rtol, atol=args.atol)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    ref = np.stack([solve_ivp(lambda _, y: -canonical._tied_grad_np(y, p, q), (0.0, args.t_end), row,
                              method="RK45", rtol=args.rtol, atol=args.atol).y[:, -1] for row in x0])
    theirs = time.perf_counter() - start
    print(f"{x0.shape[0]} trajectories to t = {args.t_end:g} (rtol {args.rtol:g}, atol {args.atol:g})")
    print(f"vectorised Dormand-Prince: {ours:.2f} s")
    print(f"solve_ivp per trajectory:  {theirs:.2f} s")
    print(f"ratio: {theirs / ours:.1f}x; max |difference| of final states {np.abs(x - ref).max():.1e}")


if __name__ == "__main__":
    main()
