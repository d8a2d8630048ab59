"""pytest plugin for spdflow plugin authors."""
