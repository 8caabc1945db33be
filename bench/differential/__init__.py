"""Differential judgement: each case's trace compared with a stored reference trace of the same case.

- capture.py   what the wire proxy keeps of every exchange for the judgement (`trace` on each wire line): the
               fields of a JSON answer, the messages of a Connect stream, the size and digest of other bodies
- trace.py     a case's trace: the traced exchanges of its wire window, keyed by route, in order
- policy.py    the field-policy table (sandboxes/e2b/differential.toml) and each policy's comparison
- reference.py the stored reference traces (sandboxes/e2b/reference/<suite>/<runner>.jsonl) and `e2b-bench reference`
- judge.py     a case's trace against its reference: the differences, and the outcome they make
"""
