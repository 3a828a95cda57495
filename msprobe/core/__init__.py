"""Framework-neutral layers: config, runtime state, names, records, statistics, writer, reader."""
