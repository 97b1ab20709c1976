"""What users run, built on the layers below: one module a verb (demo, bench, publish, rehearse, memory, ...)."""
