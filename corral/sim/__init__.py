"""corral.sim"""
