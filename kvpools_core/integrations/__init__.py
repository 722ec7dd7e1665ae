"""Drop-in answers for other tools' APIs, computed by kvpools' plans (:mod:`.aiconfigurator`)."""
