# ci06: a JSON display (a json result) and a dict as the last expression (the main result's text).
from IPython.display import JSON, display

display(JSON({"answer": 42, "items": [1, 2]}))
{"k": 1}  # noqa: B018 (the main result)
