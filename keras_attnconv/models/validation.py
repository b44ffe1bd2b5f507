"""Checks of config fields with messages that name the field and the value."""


def check_config_fields(config, positive=(), rates=()):
    """Raises ValueError for a non-positive integer field or a rate outside [0, 1)."""
    for field in positive:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{field}` must be a positive integer. Received: {field}={value!r}")
    for field in rates:
        value = getattr(config, field)
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"`{field}` must be in [0, 1). Received: {field}={value!r}")
    num_classes = getattr(config, "num_classes", None)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"`num_classes` must be an integer >= 2. Received: num_classes={num_classes!r}")
