"""The engine: typed config, the runtime state and its one reset, selection, flush policy, the
writer, watch mode and the handles every install returns. No MindSpore hooks live here."""
