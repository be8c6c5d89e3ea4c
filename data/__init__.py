"""Data files tokenyard ships: the public traces its examples, benchmarks and tests replay
(traces/), and the published measurements its latency model is reduced from (calibration/).
Sources and licences: traces/README.md, calibration/README.md, licenses/.

    TRACES / "mooncake_conversation_trace.jsonl.gz"   and so on (gzip; the readers open .gz)

Installed as package data (`tokenyard.data`), so the paths hold in a wheel install as in a
checkout.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent
TRACES = ROOT / "traces"
CALIBRATION = ROOT / "calibration"
