"""The README's picture, regenerated: `python -m tools.readme_image [--work DIR]`.

Runs the README's first Python example (the two-layer model on random 3-state kernels, 600 steps, seed 0) in a
work folder, opens the report it saves in Debian's chromium (offline, 1280 x 800), photographs the first screen
(the title down to the contents) and writes `docs/images/report.png` with `docs/images/report.json` beside it: what
the picture shows (the verdict, the circuit's kept and total edges, its nodes), which
`tests/project/test_readme_image.py` checks against the current output. Both files are written atomically.
"""

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "docs" / "images" / "report.png"
SHOWN = IMAGE.with_suffix(".json")
CHROMIUM = os.environ.get("MARKOV_INTERP_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1100, "height": 800}


def readme_example() -> str:
    """The README's first Python block (the example the picture is the report of)."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)[0]


def shown(mech) -> dict:
    """What the first screen shows of a `MechanismReport`: the verdict, the kept and total edges, the nodes."""
    graph = mech.graph
    return {"mechanism": mech.mechanism, "confident": bool(mech.confident), "kept": len(graph.kept),
            "edges": len(graph.edges), "nodes": sorted(graph.nodes)}


def run_example(work: Path) -> tuple[Path, dict]:
    """Run the README's example in `work`; (its report file, what its first screen shows)."""
    import torch

    torch.set_num_threads(1)
    here = os.getcwd()
    os.chdir(work)
    try:
        namespace: dict = {}
        exec(compile(readme_example(), "README.md", "exec"), namespace)
    finally:
        os.chdir(here)
    return work / "runs" / "icl-3" / "report.html", shown(namespace["mech"])


def photograph(report_html: Path) -> bytes:
    """The first screen of `report_html` (down to the contents) as PNG bytes, with the network cut off."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:", "about:"))
                       else r.abort())
            page.goto(report_html.resolve().as_uri(), wait_until="load")
            nav = page.evaluate("() => document.querySelector('nav').getBoundingClientRect().top + scrollY")
            return page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                                         "height": min(float(nav), 1400.0)})
        finally:
            browser.close()


def main(argv: "list[str] | None" = None) -> int:
    from markov_interp._io import atomic_write

    parser = argparse.ArgumentParser(prog="python -m tools.readme_image", description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="folder to train the example in (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        report_html, facts = run_example(work)
        atomic_write(IMAGE, photograph(report_html))
    atomic_write(SHOWN, json.dumps(facts, indent=2, sort_keys=True) + "\n")
    print(f"{IMAGE.relative_to(ROOT)}: {facts['mechanism']}, {facts['kept']} of {facts['edges']} edges kept, "
          f"nodes {', '.join(facts['nodes'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
