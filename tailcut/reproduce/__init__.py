"""`tailcut reproduce PAPER`: run what reproduces a paper's headline results on this host
and write a report that puts each of the paper's numbers next to ours.

The papers' own numbers are in ``tailcut.papers`` (one data file per paper).

- ``run``: one paper or all four, from steps to reports;
- ``steps``: the commands a reproduction runs, with progress and resumption;
- ``measure``: reading our numbers back from the steps' CSV/JSON, each with its source;
- ``report``: the Markdown report, comparison.csv and ours.json;
- ``environment``: versions and machine facts, and `tailcut doctor`'s table;
- one module per paper (``apnet19``, ``cadentflow``, ``imc20``, ``mlfabric``): its steps
  and how its numbers are read from them.
"""
