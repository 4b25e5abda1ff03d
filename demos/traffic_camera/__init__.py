"""The traffic-camera demo: rendered road scenes (``scene``), the detector's training script
(``train``, run as a script), and the app behind ``splitinfer demo`` (``app``)."""
