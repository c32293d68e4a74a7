"""Improving the model from a diagnosis, behind the acceptance check (docs/loop.md).

`conductor` (`evalloop improve`) runs the improver on one model-owned issue and writes its
`candidate`, checked by `expert` (over `figures`) and read by `reviewer`; `acceptance`
(`evalloop accept`) runs two blind arms and decides through `measure.gate`, with `sidedoor`
saying which golden changes excuse a moved dataset; `checkpoint` commits an accepted edit and
restores one; `loop` (`evalloop loop`) walks one batch under one `budget`.

Layer 12 of the declared order (`tests/test_architecture.py`), the last stage of the loop;
`review`, `session` and `scale` sit above it, then the pytest face. It may import `report`,
`diagnose` and every layer below them (`goldens`, `answer`, `targets`, `roles`, `measure`,
`ledger`, `judge`, `model_api`, `sets`, the bottom layer); never `review`, `session`, `scale`
or the pytest face (`plugin`, `runtime`, `cli`, ...).
"""
