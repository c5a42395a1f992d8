"""MLA: the closed forms every engine must compute (`derive`), the checkers that compare an engine with them
(`checks`), and op-level localisation of a divergence with msprobe (`localize`)."""
