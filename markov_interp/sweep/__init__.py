"""Sweeps: grids of training runs, run in parallel, restartable, failure-isolated, summarised in one table.

The research questions of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) are about regimes:
p + q, weight tying, depth, initialisation, precision and seeds. A `SweepSpec` names a base run config and a
grid over any source / model / training option plus a list of seeds; every point of the grid is a *cell*, one
training run whose folder name is a hash of its full config (so the same cell is the same folder in every
sweep that contains it). `run(spec, out_dir)` trains every cell (a child process per cell, as many at once
as cores, one torch thread each, or Ray tasks), probes each trained model with `probes.classify_mechanism`,
and writes one tidy results table: one row per cell with its config columns, final losses, the `theory`
reference losses, the "stuck at the unigram loss" flag and the mechanism with its key probe scores.

Layout of a sweep folder:

    out_dir/spec.json             the spec(s) of the latest call (informational)
    out_dir/runs/<cell_id>/       the training run folder (see `training`): config.json, metrics.jsonl, ...
    out_dir/results/<cell_id>.json  the cell's row once finished, or its error and traceback if it failed
    out_dir/results.csv           the table (also results.parquet when pyarrow is installed)
    out_dir/.lock                 held while a sweep runs cells here (a second sweep is refused at once)

A row is typed end to end: `run_cell` returns a `CellResult` (built from `training.TrainResult.final` and the
`probes.MechanismReport`'s attributes, the latter as `ProbeColumns`), `run` returns `Row`s, and only the table
flattens them to columns (`Row.columns`); `read_table` reads them back through one typed reader
(`Row.from_columns`, each column decoded by the type of the field it holds).

Restart: a cell whose results file says "ok" (with the same probe settings) or "diverged" is not run again;
a cell that failed is retried; a cell interrupted mid-training resumes from its newest checkpoint (`training.train`).
A folder whose cells were trained before counter streams keeps their stream ("torch-1", `folder_stream`) for every
cell whose spec names none, so it restarts, is re-probed and is extended without retraining.

A spec file (TOML):

    name = "pq-tied"
    seeds = [0, 1, 2]            # each grid point is trained once per seed (train.seed)

    [base.source]
    kind = "binary"
    p = 0.5
    q = 0.8

    [base.model]                 # `preset` is optional; other keys override it; d_vocab follows the source
    preset = "paper-1layer"

    [base.train]
    steps = 400
    seq_len = 256

    [grid]                       # dotted keys: source.*, model.*, train.*
    "source.p" = [0.2, 0.5, 0.8]
    "model.tie_weights" = [true, false]

    [[exclude]]                  # optional: grid points to leave out (every key given must match)
    "source.p" = 0.5
    "source.q" = 0.5

The package, left to right: `spec` (SweepSpec, Cell, load_spec, cell_id) -> `cells` (run_cell, run_stack,
group_cells, failure isolation) -> `executors` (local supervised processes, Ray) -> `records` (a cell's typed
record file, restart) -> `table` (typed rows, results.csv) -> `runner` (`run`). `results` holds the typed
`CellResult` / `ProbeColumns` and `outcome`; `probing` (the only module that imports `probes`) is loaded only
where a cell is probed.
"""

from markov_interp.sweep.cells import DEFAULT_GROUP, default_group, group_cells, run_cell, run_stack
from markov_interp.sweep.executors import ClusterLost
from markov_interp.sweep.records import RESULTS_DIR, RUNS_DIR, CellRecord
from markov_interp.sweep.results import MIN_GAP, STUCK_FRACTION, CellResult, ProbeColumns, outcome
from markov_interp.sweep.runner import SpecLike, SweepResult, folder_stream, run
from markov_interp.sweep.spec import Cell, SweepSpec, cell_id, load_spec
from markov_interp.sweep.table import TABLE, Row, read_table, write_table

__all__ = [
    "SweepSpec",
    "Cell",
    "load_spec",
    "cell_id",
    "run",
    "folder_stream",
    "run_cell",
    "run_stack",
    "group_cells",
    "default_group",
    "DEFAULT_GROUP",
    "SweepResult",
    "SpecLike",
    "Row",
    "CellResult",
    "CellRecord",
    "ProbeColumns",
    "outcome",
    "read_table",
    "write_table",
    "STUCK_FRACTION",
    "MIN_GAP",
    "RUNS_DIR",
    "RESULTS_DIR",
    "TABLE",
    "ClusterLost",
]
