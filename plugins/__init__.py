"""kvpools' built-in plugins, each declared in the ``kvpools`` entry-point group like a third party's."""
