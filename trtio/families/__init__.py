"""Model families, one folder each (``docs/architecture.md``, "Families and components"): a family's typed config,
its feature, its pools. The table that registers them is :mod:`trtio.families.family_table`."""
