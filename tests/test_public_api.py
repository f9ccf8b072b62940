import exporter


def test_public_surface_is_pinned():
    import types

    public = sorted(name for name in dir(exporter) if not name.startswith("_")
                    and not isinstance(getattr(exporter, name), types.ModuleType))
    assert public == sorted(exporter.__all__)
    assert all(callable(getattr(exporter, name)) for name in public)
    assert exporter.__all__ == ["collector", "configure", "instrument", "labels",
                                "start_http_server", "track", "uninstrument"]
