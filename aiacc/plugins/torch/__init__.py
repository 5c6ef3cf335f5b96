"""aiacc torch plugin. Import-light: submodules import the framework when they are imported."""
