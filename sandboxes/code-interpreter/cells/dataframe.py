# ci05: a pandas DataFrame as the last expression: the main result, with an html table and its text.
import pandas as pd

pd.DataFrame({"a": [1, 2], "b": [3, 4]})
